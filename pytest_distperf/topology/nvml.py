"""The NVML probe (nvidia-ml-py): devices under their CUDA indices (CUDA_VISIBLE_DEVICES), NVLinks
(direct or through NVSwitches), PCIe paths; `pynvml` is imported inside `probe_nvml` only."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_distperf.topology.host import host_facts
from pytest_distperf.topology.model import UNKNOWN, Device, Link, Topology

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi words. INTERNAL (two GPUs on one
# board behind its own bridge, e.g. K80) is what nvidia-smi prints as PIX.
_ANCESTOR_CLASS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetNvLinkVersion returns an nvmlNvlinkVersion_t enum value, not the version number
# itself; we store the major version.
_NVLINK_MAJOR = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
_REMOTE_GPU, _REMOTE_NPU, _REMOTE_SWITCH = 0, 1, 2


def resolve_visible_devices(
    value: str | None, uuids: Sequence[str]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(NVML index of cuda:0, cuda:1, ...) and notes, as the CUDA runtime reads `value` (None:
    unset) over `uuids` in NVML (PCI) order: an entry that names no device ends the list."""
    if value is None:
        return tuple(range(len(uuids))), ()
    chosen: list[int] = []
    notes: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={value!r} names a MIG instance; a MIG slice has no link "
                "topology of its own, so links are not probed"
            )
        index: int | None = None
        if re.fullmatch(r"[+-]?\d+", entry):
            n = int(entry)
            index = n if 0 <= n < len(uuids) else None
        elif entry.upper().startswith("GPU-"):
            # CUDA accepts any unambiguous UUID prefix.
            hits = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
            index = hits[0] if len(hits) == 1 else None
        if index is None or index in chosen:
            if entry:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} names no further device, so it "
                    "and the entries after it are ignored, as CUDA does"
                )
            break
        chosen.append(index)
    return tuple(chosen), tuple(notes)


def run_devices(
    uuids: Sequence[str], indices: Sequence[int] | None
) -> tuple[tuple[int, ...], list[int], list[str]]:
    """(NVML index of each CUDA index, the CUDA indices the run uses, notes): `indices` (None:
    all visible) checked against what CUDA_VISIBLE_DEVICES shows of `uuids`."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible, env_notes = resolve_visible_devices(env, uuids)
    wanted = list(range(len(visible))) if indices is None else list(indices)
    shown = "unset" if env is None else repr(env)
    for i in wanted:
        if not 0 <= i < len(visible):
            raise ValueError(
                f"the run uses cuda:{i} but only {len(visible)} CUDA device(s) are visible "
                f"(CUDA_VISIBLE_DEVICES {shown})"
            )
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"device indices repeat: {wanted}")
    notes = list(env_notes)
    if any(visible[i] != i for i in wanted):
        pairs = ", ".join(f"cuda:{i}=GPU{visible[i]}" for i in wanted)
        notes.append(
            f"CUDA_VISIBLE_DEVICES={env!r} maps the run's devices to nvidia-smi's numbers: {pairs}"
        )
    return visible, wanted, notes


def as_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def normal_bus_id(value: Any) -> str | None:
    """NVML's PCI bus id form ("00000000:19:00.0"), or None for its no-device placeholder."""
    m = re.fullmatch(
        r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", as_text(value).strip().lower()
    )
    if not m:
        return None
    domain, bus, dev, fn = (int(g or "0", 16) for g in m.groups())
    # An NVLink whose far end is an NVSwitch reports the placeholder FFFFFFFF:FF:FF.0.
    if domain == 0xFFFFFFFF or bus == 0xFF:
        return None
    return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"


@dataclass(frozen=True)
class _LinkEnd:
    """One active NVLink of a GPU: where its far end is."""

    remote_bus: str | None
    to_switch: bool
    version: int | None


def _const(nv: Any, name: str, default: int) -> int:
    value = getattr(nv, name, default)
    # pynvml defines NVML_P2P_CAPS_INDEX_READ as `0,` (a tuple); ctypes rejects a tuple.
    if isinstance(value, tuple):
        value = value[0] if value else default
    return int(value)


def _nvml_try(nv: Any, fn_name: str, *args: Any) -> Any:
    """Call an NVML function; None when the driver says no (not supported, old driver, ...)."""
    fn = getattr(nv, fn_name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _nvlink_ends(nv: Any, handle: Any, gpu_buses: set[str]) -> list[_LinkEnd]:
    ends = []
    enabled = _const(nv, "NVML_FEATURE_ENABLED", 1)
    for link in range(_const(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        # Links past the GPU's own count answer InvalidArgument; GPUs without NVLink NotSupported.
        if _nvml_try(nv, "nvmlDeviceGetNvLinkState", handle, link) != enabled:
            continue
        pci = _nvml_try(nv, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        remote = normal_bus_id(getattr(pci, "busId", ""))
        kind = _nvml_try(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if kind == _REMOTE_NPU:
            continue  # an NVLink to a POWER CPU: host traffic, not GPU-to-GPU
        if kind in (_REMOTE_GPU, _REMOTE_SWITCH):
            to_switch = kind == _REMOTE_SWITCH
        else:
            # Drivers without the device-type query (DGX-2 era): a far end that is no GPU of this
            # host is taken for an NVSwitch (POWER9 NPUs came with drivers that have the query).
            to_switch = remote not in gpu_buses
        version = _nvml_try(nv, "nvmlDeviceGetNvLinkVersion", handle, link)
        ends.append(_LinkEnd(remote, to_switch, _NVLINK_MAJOR.get(version)))
    return ends


def _nvml_pair(
    nv: Any,
    a: int,
    b: int,
    handles: tuple[Any, Any],
    buses: tuple[str | None, str | None],
    ends: tuple[list[_LinkEnd], list[_LinkEnd]],
    notes: list[str],
) -> Link:
    """The link between CUDA devices `a` and `b`; what NVML could not say goes to `notes`."""
    ha, hb = handles
    ok = _const(nv, "NVML_P2P_STATUS_OK", 0)
    p2p_status = _nvml_try(
        nv, "nvmlDeviceGetP2PStatus", ha, hb, _const(nv, "NVML_P2P_CAPS_INDEX_READ", 0)
    )
    p2p = None if p2p_status is None else p2p_status == ok
    # NVLink first: NVML's common ancestor only describes the PCIe path, so it names a PCIe level
    # even for a pair joined by NVLinks.
    direct_ab = [e for e in ends[0] if not e.to_switch and e.remote_bus == buses[1]]
    direct_ba = [e for e in ends[1] if not e.to_switch and e.remote_bus == buses[0]]
    direct = direct_ab if len(direct_ab) >= len(direct_ba) else direct_ba
    switch_a = [e for e in ends[0] if e.to_switch]
    switch_b = [e for e in ends[1] if e.to_switch]
    # Through NVSwitches a pair gets the smaller GPU's link count, as nvidia-smi prints; Fabric
    # Manager can partition the switches (cloud VMs): NVML says whether the pair can talk.
    switched = switch_a if len(switch_a) <= len(switch_b) else switch_b
    if switched and not direct:
        status = _nvml_try(
            nv, "nvmlDeviceGetP2PStatus", ha, hb, _const(nv, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
        )
        if status is not None and status != ok:
            notes.append(
                f"GPU{a}-GPU{b}: both have active NVLinks to NVSwitches but NVML reports no "
                f"NVLink peer access (status {status}, another NVLink partition or Fabric Manager "
                "down?); using the PCIe path"
            )
            switched = []
    counted = direct + switched
    if counted:
        versions = {e.version for e in counted if e.version is not None}
        version = min(versions) if versions else None
        n = len(counted)
        return Link(a, b, f"NV{n}", n, version, p2p)
    level = _nvml_try(nv, "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
    link_class = _ANCESTOR_CLASS.get(level, UNKNOWN) if level is not None else UNKNOWN
    if link_class == UNKNOWN:
        notes.append(f"GPU{a}-GPU{b}: NVML gave no PCIe common ancestor (answer {level!r})")
    return Link(a, b, link_class, p2p_supported=p2p)


def probe_nvml(indices: Sequence[int] | None = None) -> Topology:
    """The run's GPUs through NVML: `indices` are CUDA indices (None: all visible). Raises
    ImportError, pynvml.NVMLError (no driver's answer) or ValueError (indices not visible)."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        count = int(nv.nvmlDeviceGetCount())
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [as_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        visible, wanted, notes = run_devices(uuids, indices)
        # No PCI info (None): no busId, which normal_bus_id reads as no bus.
        pcis = [_nvml_try(nv, "nvmlDeviceGetPciInfo", h) for h in handles]
        buses = [normal_bus_id(getattr(pci, "busId", "")) for pci in pcis]
        gpu_buses = {bus for bus in buses if bus is not None}
        devices = []
        for cuda_index in wanted:
            h = handles[visible[cuda_index]]
            memory = _nvml_try(nv, "nvmlDeviceGetMemoryInfo", h)
            devices.append(
                Device(
                    index=cuda_index,
                    name=as_text(nv.nvmlDeviceGetName(h)),
                    memory_bytes=int(memory.total) if memory is not None else 0,
                    pcie_gen_max=_nvml_try(nv, "nvmlDeviceGetMaxPcieLinkGeneration", h),
                    pcie_gen_current=_nvml_try(nv, "nvmlDeviceGetCurrPcieLinkGeneration", h),
                    pcie_width_max=_nvml_try(nv, "nvmlDeviceGetMaxPcieLinkWidth", h),
                    pcie_width_current=_nvml_try(nv, "nvmlDeviceGetCurrPcieLinkWidth", h),
                    bus_id=buses[visible[cuda_index]],
                )
            )
        ends = {i: _nvlink_ends(nv, handles[visible[i]], gpu_buses) for i in wanted}
        links = []
        for n, a in enumerate(wanted):
            for b in wanted[n + 1 :]:
                na, nb = visible[a], visible[b]
                pair = (handles[na], handles[nb]), (buses[na], buses[nb]), (ends[a], ends[b])
                links.append(_nvml_pair(nv, a, b, *pair, notes))
        if any(e.to_switch for es in ends.values() for e in es) and any(
            link.is_nvlink for link in links
        ):
            notes.append("NVLink through NVSwitch: each pair counts the smaller GPU's link count")
    finally:
        # A failed shutdown must not hide the probe's result (or its exception).
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    _, cpus, sockets = host_facts()
    return Topology("cuda", tuple(devices), tuple(links), "nvml", cpus, sockets, tuple(notes))
