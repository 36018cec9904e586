"""What links join a run's devices: probed or loaded, as a frozen `Topology` whose `key()` names
the kind of machine for baselines. No torch, no pytest; `pynvml` only inside `probe_nvml`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from pytest_distperf.topology.files import load_nvidia_smi_topo, load_topology
from pytest_distperf.topology.host import host_facts, probe_cpu
from pytest_distperf.topology.model import UNKNOWN, Device, Link, Network, Topology, TopologyError
from pytest_distperf.topology.nvml import probe_nvml
from pytest_distperf.topology.smi import parse_nvidia_smi_topo, probe_nvidia_smi

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
    """The topology of `device_count` devices; never raises. CUDA: NVML, else `nvidia-smi`,
    else "unknown" links whose notes say what failed (a verdict then declines to judge)."""
    accel = accelerator.strip().lower() if isinstance(accelerator, str) else ""
    if not re.fullmatch(r"[a-z][a-z0-9]*", accel):
        accel = UNKNOWN
    try:
        if accel == "cpu":
            return probe_cpu(device_count)
        if accel != "cuda":
            return _degraded(
                accel, device_count, [f"no link probe for accelerator {accelerator!r}"]
            )
        indices = list(range(device_count))
        failures = []
        try:
            return probe_nvml(indices)
        except Exception as exc:  # noqa: BLE001 - any NVML failure means: try the next probe
            failures.append(f"NVML unavailable: {_describe(exc)}")
        try:
            found = probe_nvidia_smi(indices)
            return replace(found, notes=tuple(failures) + found.notes)
        except FileNotFoundError:
            failures.append("nvidia-smi not found")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"nvidia-smi failed: {_describe(exc)}")
        return _degraded(accel, device_count, ["; ".join(failures) + "; link classes unknown"])
    except Exception as exc:  # noqa: BLE001 - the last resort behind "never raises"
        return _degraded(accel, device_count, [f"topology probe failed: {_describe(exc)}"])


def _degraded(accelerator: str, device_count: int, notes: Iterable[str]) -> Topology:
    n = max(device_count, 0)
    _, cpus, sockets = host_facts()
    devices = tuple(Device(index=i, name=UNKNOWN, memory_bytes=0) for i in range(n))
    links = tuple(Link(a, b, UNKNOWN) for a in range(n) for b in range(a + 1, n))
    return Topology(accelerator, devices, links, "none", cpus, sockets, tuple(notes))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
