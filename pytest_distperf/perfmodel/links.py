"""What a collective and a memory read cost on the run's devices: measured in the ranks or
nominal from a topology, chosen once for the gate and `distperf predict` (`run_links`); a job
over several nodes gets the network's figures beside one node's. Sources: docs/perfmodel.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pytest_distperf.perfmodel.calibration import LATENCY_PROBE_BYTES, Calibration, bus_factor
from pytest_distperf.perfmodel.terms import GB
from pytest_distperf.topology.model import Network

if TYPE_CHECKING:
    from pytest_distperf.topology import Topology


@dataclass(frozen=True)
class Links:
    """What a collective and a memory read cost on the run's devices, measured or nominal."""

    link_class: str  # the slowest link between the run's devices, as nvidia-smi writes it
    world_size: int
    busbw: float  # bytes/s at large messages: nominal, or the largest calibrated size
    latency_s: float  # one small collective
    memory_bandwidth: float | None  # bytes/s a device streams from its memory; None: unknown
    measured: bool
    calibration: Calibration | None = None
    assumptions: tuple[str, ...] = field(default=())
    copy_bandwidth: float | None = None  # copies into new buffers; None: memory_bandwidth
    overlap: float = 0.0  # share of transfer and host work hidden behind each other (measured)
    # Over several nodes the figures above are the whole job's (the network's); `node` is one
    # node's own links (None: one rank per node).
    nodes: int = 1
    node: Links | None = None
    # The network's calls cost nothing: predict compares with it to name the network's share.
    network_free: bool = False
    # The least a collective between host-run layers costs, the ranks' drift included; 0: none.
    in_step_latency_s: float = 0.0

    def in_step(self, seconds: float) -> Links:
        """These links with each collective costing at least `seconds` (timed in the run)."""
        note = (
            f"collective latency at least {seconds * 1e6:.3g} us a call: an all-reduce where the "
            "strategy sums, timed in the ranks between the whole model's layers"
        )
        latency = max(self.in_step_latency_s, seconds)
        return replace(self, in_step_latency_s=latency, assumptions=(*self.assumptions, note))

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.world_size // self.nodes)

    def crosses_nodes(self, ranks: int) -> bool:
        """Whether a group of the run's first `ranks` ranks spans several nodes."""
        return self.nodes > 1 and ranks > self.ranks_per_node

    def hops_across_nodes(self, ranks: int) -> int:
        """How many hops of the chain of the first `ranks` ranks go from a node to the next."""
        return (ranks - 1) // self.ranks_per_node if self.nodes > 1 and ranks > 1 else 0

    def collective_time(self, op: str, nbytes: float, world_size: int) -> tuple[float, float]:
        """(transfer, latency) seconds of one `op` of `nbytes` among `world_size` ranks: within
        one node at its own links, across nodes at the whole job's."""
        if world_size <= 1:
            return 0.0, 0.0
        if self.node is not None and not self.crosses_nodes(world_size):
            return self.node.collective_time(op, nbytes, world_size)
        if self.network_free and self.nodes > 1:
            return 0.0, 0.0
        cal = self.calibration
        if cal is not None and cal.figures(op):
            total = cal.time_at(op, nbytes)
            smallest = cal.figures(op)[0]  # this op's own small call: all latency, no transfer
            small = smallest.bytes <= LATENCY_PROBE_BYTES
            floor = max(self.latency_s, smallest.time_s) if small else self.latency_s
            transfer = max(total - floor, 0.0)
            if world_size != cal.world_size:
                # Measured at another size of group: the same link carries a different share.
                transfer *= bus_factor(op, world_size) / bus_factor(op, cal.world_size)
            return transfer, max(min(floor, total), self.in_step_latency_s)
        latency = max(self.latency_s, self.in_step_latency_s)
        if self.busbw <= 0:
            return math.inf, latency
        return nbytes * bus_factor(op, world_size) / self.busbw, latency

    @property
    def p2p_measured(self) -> bool:
        return self.calibration is not None and bool(self.calibration.p2p)

    def hop_time(self, nbytes: float, across_nodes: bool = True) -> tuple[float, float]:
        """(transfer, latency) seconds of one point-to-point hop, within a node at its own links:
        measured send/recv where calibrated, else one hop of the all-gather's ring."""
        if not across_nodes and self.node is not None:
            return self.node.hop_time(nbytes)
        if self.network_free and self.nodes > 1:
            return 0.0, 0.0
        cal = self.calibration
        if cal is not None and cal.p2p:
            total = cal.time_at("p2p", nbytes)
            latency = min(cal.p2p[0].time_s, total)
            return total - latency, latency
        if self.busbw <= 0:
            return math.inf, self.latency_s
        return nbytes / self.busbw, self.latency_s

    def busbw_at(self, op: str, nbytes: float) -> float:
        if self.calibration is not None and self.calibration.figures(op):
            return self.calibration.busbw_at(op, nbytes)
        return self.busbw


# Per-direction GB/s of one NVLink by NVLink version (NVIDIA's specifications).
NVLINK_GBPS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 26.5625, 5: 50.0}
NVLINK_UNKNOWN_GBPS = 25.0
# NCCL's all-gather bus bandwidth over an H200 pair / its 18 links' spec figure: the reference
# measurement (docs/perfmodel.md, NVLink; docs/benchmarks/h200-2026-11-29.md).
NVLINK_EFFICIENCY = 0.56
# Effective GB/s per direction of a x16 link after encoding and protocol overhead, by generation.
PCIE_X16_GBPS = {1: 3.0, 2: 6.0, 3: 12.0, 4: 24.0, 5: 48.0, 6: 96.0}
PCIE_DEFAULT = (4, 16)
# Without peer-to-peer NCCL relays through host memory, which halves the link's share
# (docs/perfmodel.md, PCIe; docs/benchmarks/h200-2026-11-29.md, NCCL_P2P_DISABLE=1).
HOST_STAGED_FACTOR = 0.5
# Across sockets ("SYS") the relay also crosses the SMP interconnect, shared with everything
# else: a nominal share below HOST_STAGED_FACTOR, not a measurement (docs/perfmodel.md, PCIe).
PCIE_CLASS_FACTOR = {"PIX": 1.0, "PXB": 1.0, "SYS": 0.4} | dict.fromkeys(
    ("PHB", "NODE"), HOST_STAGED_FACTOR
)
# Host-timed small all-gather (launch + sync included), seconds, when nothing was measured:
# nominal figures per link class (docs/perfmodel.md, "Nominal links"), replaced by calibrate().
NOMINAL_LATENCY_S = {
    "NV": 20e-6,
    "PIX": 30e-6,
    "PXB": 30e-6,
    "PHB": 50e-6,
    "NODE": 50e-6,
    "SYS": 60e-6,
    "LOOPBACK": 100e-6,
    "unknown": 50e-6,
}
# gloo over loopback between two 1-thread ranks: the low end of calibrate()'s all-gather at the
# models' sizes on the 2-core CI host (docs/benchmarks/cpu.md).
LOOPBACK_GBPS = 0.3

# Spec-sheet memory bandwidth (GB/s) of common GPUs, matched against the device name.
GPU_MEMORY_BANDWIDTH = {
    "H200": 4800.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100 80GB PCIe": 1935.0,
    "A100": 1555.0,
    "A10G": 600.0,
    "A10": 600.0,
    "L40S": 864.0,
    "L40": 864.0,
    "L4": 300.0,
    "A40": 696.0,
    "RTX 6000 Ada": 960.0,
    "RTX A6000": 768.0,
    "RTX A5000": 768.0,
    "RTX 4090": 1008.0,
    "RTX 3090": 936.0,
    "V100": 900.0,
    "P100": 732.0,
    "T4": 320.0,
}
# The share of the spec a large device copy reaches, rounded down from the reference H200's
# copy (docs/perfmodel.md, memory bandwidth; docs/benchmarks/h200-2026-11-29.md).
COPY_EFFICIENCY = 0.85
# With no device name: a box whose GPUs only meet over PCIe is taken for PCIe cards (A10/A10G,
# L4, A5000, 4090 in the table above), one with NVLink for SXM modules (V100 to H200).
UNKNOWN_PCIE_GPU_GBPS = 600.0
UNKNOWN_NVLINK_GPU_GBPS = 2000.0
# CPU ranks with nothing measured: one core's share of host memory streaming, and a copy into
# new memory, which pays page faults; nominal, calibrate() measures both (docs/perfmodel.md).
CPU_RANK_MEMORY_GBPS = 20.0
CPU_RANK_FRESH_COPY_GBPS = 5.0
# Nothing known of a network nobody measured: 1 Gb/s Ethernet, slow enough not to fail a healthy
# run (a nominal figure, not a measurement; the calibration replaces it).
NOMINAL_NETWORK_GBPS = 0.1
NOMINAL_NETWORK_LATENCY_S = 200e-6


def gpu_memory_bandwidth(name: str) -> float | None:
    """Spec memory bandwidth in bytes/s for a device name, or None when not in the table."""
    text = name.upper()
    # Longest keys first: "A100-SXM4-80GB" before "A100", "A10G" before "A10", "L40S" before "L4".
    for key in sorted(GPU_MEMORY_BANDWIDTH, key=len, reverse=True):
        if key.upper() in text:
            return GPU_MEMORY_BANDWIDTH[key] * GB
    return None


def _nvlink_busbw(link: Any, notes: list[str]) -> float:
    version = link.nvlink_version
    if version in NVLINK_GBPS_PER_LINK:
        per_link = NVLINK_GBPS_PER_LINK[version]
    elif link.nvlinks >= 18:
        # Only NVLink 4 (H100/H200) has 18 links per GPU; parsed nvidia-smi output names no version.
        per_link = NVLINK_GBPS_PER_LINK[4]
        notes.append(f"{link.link_class}: NVLink version unknown, 18 links read as NVLink 4")
    else:
        per_link = NVLINK_UNKNOWN_GBPS
        notes.append(
            f"{link.link_class}: NVLink version unknown, assumed {per_link:g} GB/s per link"
        )
    busbw = link.nvlinks * per_link * NVLINK_EFFICIENCY
    notes.append(
        f"nominal {link.link_class} bus bandwidth: {link.nvlinks} links x {per_link:g} GB/s x "
        f"{NVLINK_EFFICIENCY} (NCCL's share on an H200 pair) = {busbw:.3g} GB/s"
    )
    return busbw * GB


def _pcie_busbw(topology: Topology, link_class: str, notes: list[str]) -> float:
    gens = [d.pcie_gen_max for d in topology.devices if d.pcie_gen_max]
    widths = [d.pcie_width_max for d in topology.devices if d.pcie_width_max]
    gen = min(gens) if gens else PCIE_DEFAULT[0]
    width = min(widths) if widths else PCIE_DEFAULT[1]
    if not gens or not widths:
        notes.append(
            f"PCIe generation/width unknown ({topology.source}): assumed Gen{gen} x{width}"
        )
    per_x16 = PCIE_X16_GBPS.get(gen, PCIE_X16_GBPS[PCIE_DEFAULT[0]])
    factor = PCIE_CLASS_FACTOR[link_class]
    busbw = per_x16 * width / 16 * factor
    how = "direct peer-to-peer" if factor == 1.0 else f"staged through host memory, x{factor}"
    notes.append(
        f"nominal {link_class} bus bandwidth: PCIe Gen{gen} x{width} ~{per_x16 * width / 16:g} "
        f"GB/s effective, {how} = {busbw:.3g} GB/s"
    )
    return busbw * GB


def _nominal_memory_bandwidth(topology: Topology, notes: list[str]) -> float:
    if topology.accelerator == "cpu":
        notes.append(f"memory bandwidth: nominal {CPU_RANK_MEMORY_GBPS:g} GB/s per CPU rank")
        return CPU_RANK_MEMORY_GBPS * GB
    spec = gpu_memory_bandwidth(topology.device_model)
    if spec is None:
        nvlinked = any(link.is_nvlink for link in topology.links)
        spec = (UNKNOWN_NVLINK_GPU_GBPS if nvlinked else UNKNOWN_PCIE_GPU_GBPS) * GB
        kind = "NVLink-connected (SXM) GPUs" if nvlinked else "PCIe cards"
        model = topology.device_model
        source = f"GPU model {model!r} not known, assumed {kind} with {spec / GB:g} GB/s spec"
    else:
        source = f"{topology.device_model} spec {spec / GB:g} GB/s"
    effective = spec * COPY_EFFICIENCY
    notes.append(f"memory bandwidth: {source} x {COPY_EFFICIENCY} = {effective / GB:.4g} GB/s")
    return effective


def link_figures(
    topology: Topology, link: Any, notes: list[str] | None = None
) -> tuple[float, float]:
    """Nominal (bus bandwidth bytes/s, latency s) of one link; appends why to `notes`."""
    notes = [] if notes is None else notes
    cls = link.link_class
    if link.is_nvlink:
        return _nvlink_busbw(link, notes), NOMINAL_LATENCY_S["NV"]
    if cls in PCIE_CLASS_FACTOR:
        return _pcie_busbw(topology, cls, notes), NOMINAL_LATENCY_S[cls]
    if cls == "LOOPBACK":
        notes.append(f"nominal LOOPBACK bus bandwidth: gloo, {LOOPBACK_GBPS:g} GB/s")
        return LOOPBACK_GBPS * GB, NOMINAL_LATENCY_S[cls]
    # A guessed link would make a threshold worse than none; PCIe Gen3 x16 through the host is
    # slow enough not to fail a healthy run.
    busbw = PCIE_X16_GBPS[3] * HOST_STAGED_FACTOR * GB
    notes.append(f"link class {cls}: assumed host-staged PCIe Gen3 x16, {busbw / GB:g} GB/s")
    return busbw, NOMINAL_LATENCY_S["unknown"]


def nominal_links(
    topology: Topology,
    devices: int | None = None,
    memory_bandwidth: float | None = None,
    bus_bandwidth: float | None = None,
) -> Links:
    """Link figures of the first `devices` devices of a topology (nothing measured); the byte/s
    overrides (command-line flags) replace the nominal ones."""
    n = topology.device_count if devices is None else devices
    if n < 1 or n > topology.device_count:
        raise ValueError(
            f"the run uses {n} device(s) but the topology ({topology.source}) has "
            f"{topology.device_count}"
        )
    notes: list[str] = []
    run = topology.first(n)
    if memory_bandwidth is None:
        memory_bandwidth = _nominal_memory_bandwidth(topology, notes)
    else:
        notes.append(f"memory bandwidth: given, {memory_bandwidth / GB:.4g} GB/s")
    copy_bandwidth = CPU_RANK_FRESH_COPY_GBPS * GB if topology.accelerator == "cpu" else None
    if not run.links:
        return Links("none", n, 0.0, 0.0, memory_bandwidth, False, None, tuple(notes))
    slowest = run.slowest_link()
    cls = slowest.link_class
    busbw, latency = link_figures(topology, slowest, notes)
    if bus_bandwidth is not None:
        busbw = bus_bandwidth
        notes.append(f"{cls} bus bandwidth: given, {busbw / GB:.4g} GB/s")
    notes.append(f"collective latency: nominal {latency * 1e6:g} us for {cls}")
    notes.append(
        "overlap: none assumed (transfers and host work add up); only a calibration in the "
        "ranks can show a host that hides one behind the other"
    )
    return Links(
        cls, n, busbw, latency, memory_bandwidth, False, None, tuple(notes), copy_bandwidth
    )


def links_from_calibration(calibration: Calibration, link_class: str) -> Links:
    """Link figures measured in the ranks; `link_class` is the topology's slowest link."""
    gathers = calibration.all_gather
    notes: tuple[str, ...] = (
        f"collectives measured in the ranks ({calibration.backend}, {calibration.world_size} "
        f"ranks) at {len(gathers)} all-gather sizes; memory bandwidth measured by a device copy",
    )
    if calibration.in_step_latency_s > calibration.latency_s:
        notes += (
            f"collective latency {calibration.in_step_latency_s * 1e6:.3g} us a call: a small "
            "all-reduce between bursts of host compute, the ranks' drift included (fenced by a "
            f"barrier: {calibration.latency_s * 1e6:.3g} us)",
        )
    return Links(
        link_class,
        calibration.world_size,
        gathers[-1].busbw if gathers else 0.0,
        calibration.latency_s,
        calibration.memory_bandwidth or None,
        True,
        calibration,
        notes,
        calibration.fresh_copy_bandwidth or None,
        calibration.overlap,
        in_step_latency_s=calibration.in_step_latency_s,
    )


def run_links(
    topology: Topology,
    devices: int,
    calibration: Calibration | None = None,
    transport_suffix: str = "",
    *,
    memory_bandwidth: float | None = None,
    bus_bandwidth: float | None = None,
) -> Links:
    """The links a run is predicted on: measured where calibrated, else nominal; over several
    nodes (ranks placed node by node), the whole job's figures for every collective across nodes
    and one node's own (`topology`'s) within a node. `transport_suffix` ("_nccl-p2p-disable-1")
    names the measured transport."""
    if calibration is None and topology.nodes == 1:
        return nominal_links(topology, devices, memory_bandwidth, bus_bandwidth)
    if calibration is not None and calibration.nodes == 1:
        return links_from_calibration(calibration, _node_class(topology, devices, transport_suffix))
    nodes = topology.nodes if calibration is None else calibration.nodes
    if devices % nodes:
        raise ValueError(f"{devices} ranks do not split evenly over {nodes} nodes")
    per_node = devices // nodes
    network = f"network between {nodes} nodes"
    if calibration is None:
        node = nominal_links(topology, per_node, memory_bandwidth, bus_bandwidth)
        guess = (
            f"{network}: not measured; assumed {NOMINAL_NETWORK_GBPS:g} GB/s bus bandwidth and "
            f"{NOMINAL_NETWORK_LATENCY_S * 1e6:g} us latency (1 Gb/s Ethernet), slow enough not "
            "to fail a healthy run"
        )
        whole = replace(
            node,
            link_class=network,
            world_size=devices,
            busbw=NOMINAL_NETWORK_GBPS * GB,
            latency_s=NOMINAL_NETWORK_LATENCY_S,
            assumptions=(*node.assumptions, guess),
        )
    else:
        inner = calibration.within_node
        node_class = _node_class(topology, per_node, transport_suffix)
        node = None if inner is None else links_from_calibration(inner, node_class)
        if per_node == 1:
            within = "nothing stays within a node (one rank per node)"
        elif node is None:
            within = "those within a node too (none measured among one node's ranks): errs slow"
        else:
            within = "those within a node at the figures measured among one node's ranks"
        note = (
            f"{network}: every collective over ranks of several nodes is charged at the "
            f"figures measured over all {devices} ranks; {within}"
        )
        whole = links_from_calibration(calibration, network)
        whole = replace(whole, assumptions=(*whole.assumptions, note))
    return replace(whole, nodes=nodes, node=node if per_node > 1 else None)


def _node_class(topology: Topology, devices: int, transport_suffix: str) -> str:
    if devices > 1 and topology.links:
        return topology.slowest_link().link_class + transport_suffix.replace("_", " ")
    return "none"


def measured_network(topology: Topology, calibration: Calibration) -> Topology:
    """`topology` with its network's figures from a calibration over its nodes: the largest
    all-gather's bus bandwidth and the latency (unchanged where none crossed nodes)."""
    gathers = calibration.all_gather
    if topology.nodes <= 1 or calibration.nodes <= 1 or not gathers:
        return topology
    per_node = calibration.world_size // calibration.nodes
    network = Network(
        busbw=gathers[-1].busbw,
        latency_s=calibration.latency_s,
        measured_by=f"{calibration.backend} all-gather over {calibration.world_size} ranks, "
        f"{per_node} per node",
    )
    return replace(topology, network=network)
