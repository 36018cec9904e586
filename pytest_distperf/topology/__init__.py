"""What links join the devices of a run: probe them (NVML, `nvidia-smi`, CPU host) or load them.

The result is a frozen `Topology` whose `key()` names the kind of machine for baseline files, and
whose `slowest_link()` names the link class that bounds a collective across all devices.

Link classes are written as `nvidia-smi topo -m` writes them ("NV18", "PIX", "PXB", "PHB", "NODE",
"SYS"), plus "LOOPBACK" for CPU ranks on one host and "unknown" when nothing could be probed, so a
user can hold the output of that command next to ours and see the same words.

Modules: `model` (the values), `cuda` (CUDA_VISIBLE_DEVICES and bus ids), `host` (CPU host),
`smi` (`nvidia-smi` parsers and probe), `nvml` (NVML probe), `detect` (`probe` and its fallbacks),
`files` (saved topologies). No torch, no pytest here: `pynvml` is imported only inside
`probe_nvml`, so importing the plugin stays cheap on machines without GPUs.
"""

from __future__ import annotations

from pytest_distperf.topology.cuda import resolve_visible_devices
from pytest_distperf.topology.detect import probe
from pytest_distperf.topology.files import load_nvidia_smi_topo, load_topology
from pytest_distperf.topology.host import probe_cpu
from pytest_distperf.topology.model import (
    LOOPBACK,
    SCHEMA,
    UNKNOWN,
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
from pytest_distperf.topology.smi import (
    parse_nvidia_smi_topo,
    probe_nvidia_smi,
)

__all__ = [
    "LOOPBACK",
    "SCHEMA",
    "UNKNOWN",
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
    "probe_nvidia_smi",
    "probe_nvml",
    "resolve_visible_devices",
]
