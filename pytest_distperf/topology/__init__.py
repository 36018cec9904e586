"""What links join a run's devices: probed or loaded, as a frozen `Topology` whose `key()` names
the kind of machine for baselines. No torch, no pytest; `pynvml` only inside `probe_nvml`."""

from __future__ import annotations

from pytest_distperf.topology.cuda import resolve_visible_devices
from pytest_distperf.topology.detect import probe
from pytest_distperf.topology.files import load_nvidia_smi_topo, load_topology
from pytest_distperf.topology.host import probe_cpu
from pytest_distperf.topology.model import (
    Device,
    Link,
    Network,
    Topology,
    TopologyError,
    TopologyFileError,
    TopologyParseError,
    link_rank,
)
from pytest_distperf.topology.nvml import probe_nvml
from pytest_distperf.topology.smi import parse_nvidia_smi_topo

__all__ = [
    "Device",
    "Link",
    "Network",
    "Topology",
    "TopologyError",
    "TopologyFileError",
    "TopologyParseError",
    "link_rank",
    "load_nvidia_smi_topo",
    "load_topology",
    "parse_nvidia_smi_topo",
    "probe",
    "probe_cpu",
    "probe_nvml",
    "resolve_visible_devices",
]
