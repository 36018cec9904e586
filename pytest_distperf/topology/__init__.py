"""What links join a run's devices: probed or loaded, as a frozen `Topology` whose `key()` names
the kind of machine for baselines. No torch, no pytest; `pynvml` only inside the NVML probes."""

from __future__ import annotations

import re

from pytest_distperf.topology.files import load_nvidia_smi_topo, load_topology
from pytest_distperf.topology.host import host_facts, probe_cpu
from pytest_distperf.topology.model import UNKNOWN, Device, Link, Network, Topology, TopologyError
from pytest_distperf.topology.nvml import probe_nvml
from pytest_distperf.topology.smi import parse_nvidia_smi_topo

__all__ = [
    "Device",
    "Link",
    "Network",
    "Topology",
    "TopologyError",
    "load_nvidia_smi_topo",
    "load_topology",
    "parse_nvidia_smi_topo",
    "probe",
    "probe_cpu",
    "probe_nvml",
]


def probe(accelerator: str, device_count: int) -> Topology:
    """The topology of `device_count` devices; never raises. CUDA: NVML, else "unknown" links
    whose notes say what failed (a verdict then declines to judge)."""
    accel = accelerator.strip().lower() if isinstance(accelerator, str) else ""
    if not re.fullmatch(r"[a-z][a-z0-9]*", accel):
        accel = UNKNOWN
    try:
        if accel == "cpu":
            return probe_cpu(device_count)
        if accel != "cuda":
            return _degraded(accel, device_count, f"no link probe for accelerator {accelerator!r}")
        return probe_nvml(list(range(device_count)))
    except Exception as exc:  # noqa: BLE001 - "never raises": the note says what failed
        if accel == "cuda":
            note = f"NVML unavailable: {_describe(exc)}; link classes unknown"
            return _degraded(accel, device_count, note)
        return _degraded(accel, device_count, f"topology probe failed: {_describe(exc)}")


def _degraded(accelerator: str, device_count: int, note: str) -> Topology:
    n = max(device_count, 0)
    _, cpus, sockets = host_facts()
    devices = tuple(Device(index=i, name=UNKNOWN, memory_bytes=0) for i in range(n))
    links = tuple(Link(a, b, UNKNOWN) for a in range(n) for b in range(a + 1, n))
    return Topology(accelerator, devices, links, "none", cpus, sockets, (note,))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
