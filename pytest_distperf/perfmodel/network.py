"""The network between a job's nodes: the share of each link term that crossing nodes costs
(`network_charge`), and the topology's network figures once measured (`measured_network`);
docs/perfmodel.md ("Multi-node jobs")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_distperf.perfmodel.links import network_class
from pytest_distperf.perfmodel.terms import GB, LINK_TERMS, ms
from pytest_distperf.topology.model import Network

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.calibration import Calibration
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.topology.model import Topology


@dataclass(frozen=True)
class NetworkCharge:
    """For each link term, the seconds of it that crossing nodes costs (per token or step)."""

    nodes: int
    terms: dict[str, float]
    busbw: float  # bytes/s of the network's figures at large messages
    latency_s: float
    measured: bool

    @property
    def seconds(self) -> float:
        return sum(self.terms.values())

    def describe(self, per: str = "token") -> str:
        """E.g. "network term: 3.1 ms per token (all_gather 2.9 ms, ...) crosses the network
        between 2 nodes at its measured 0.31 GB/s bus bandwidth, 250 us latency"."""
        kind = "measured" if self.measured else "nominal"
        latency = f"{self.latency_s * 1e6:.3g} us"
        figures = f"{kind} {self.busbw / GB:.3g} GB/s bus bandwidth, {latency} latency"
        where = network_class(self.nodes)
        if not self.terms:
            return f"network term: none (nothing crosses the {where}; its {figures})"
        parts = ", ".join(f"{k} {ms(v)}" for k, v in self.terms.items())
        return (
            f"network term: {ms(self.seconds)} per {per} ({parts}) crosses the {where} at its "
            f"{figures}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "seconds": self.seconds,
            "terms": dict(self.terms),
            "busbw": self.busbw,
            "latency_s": self.latency_s,
            "measured": self.measured,
        }


def network_charge(
    links: Links, terms: Mapping[str, float], terms_on: Callable[[Links], Mapping[str, float]]
) -> NetworkCharge | None:
    """Each link term less the same collectives' (`terms_on`) with the network's calls free;
    None on one node."""
    if links.nodes <= 1:
        return None
    free = terms_on(replace(links, network_free=True))
    shares = {k: v - free.get(k, 0.0) for k, v in terms.items() if k in LINK_TERMS}
    return NetworkCharge(
        links.nodes,
        {k: v for k, v in shares.items() if v > 0},
        links.busbw,
        links.latency_s,
        links.measured,
    )


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
