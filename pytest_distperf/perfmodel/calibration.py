"""Calibration values measured in the ranks, in nccl-tests conventions, and the message sizes
worth measuring. Pure: the ranks fill these in (ranks/calibrate.py), everything else reads them.

Conventions (nccl-tests, doc/PERFORMANCE.md): an all-gather's `bytes` is its gathered OUTPUT
size; algbw = bytes / time; all-gather busbw = algbw x (n-1)/n; all-reduce busbw = algbw x
2(n-1)/n; a point-to-point hop ("p2p", nccl-tests' sendrecv: every rank sends to the next and
receives from the one before) busbw = algbw.

In a job over several nodes the figures are the whole job's, so every one of them crossed the
network between the nodes ("network" scope); `within_node` holds the same collectives among one
node's ranks ("node" scope), measured when a node has two ranks or more.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPS = ("all_gather", "all_reduce", "p2p")
# Added after calibrations were first written: absent from older reports, read as none measured.
OPTIONAL_OPS = frozenset({"p2p"})
# Which links a calibration's figures crossed, as its JSON names them.
NODE_SCOPE = "node"
NETWORK_SCOPE = "network"


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw: (n-1)/n for all-gather, 2(n-1)/n for all-reduce, 1 for p2p."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if op == "all_gather":
        return (world_size - 1) / world_size
    if op == "all_reduce":
        return 2 * (world_size - 1) / world_size
    if op == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


@dataclass(frozen=True)
class CollectiveFigure:
    """One measured collective, nccl-tests style; `bytes` is an all-gather's OUTPUT size."""

    op: str
    bytes: int
    time_s: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s

    @classmethod
    def from_time(cls, op: str, nbytes: int, time_s: float, world_size: int) -> CollectiveFigure:
        algbw = nbytes / time_s if time_s > 0 else 0.0
        return cls(op, int(nbytes), float(time_s), algbw, algbw * bus_factor(op, world_size))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], where: str = "collective figure"
    ) -> CollectiveFigure:
        op = _field(data, "op", str, where)
        if op not in OPS:
            raise ValueError(f"{where}: unknown op {op!r}")
        return cls(
            op=op,
            bytes=int(_field(data, "bytes", (int,), where)),
            time_s=float(_field(data, "time_s", (int, float), where)),
            algbw=float(_field(data, "algbw", (int, float), where)),
            busbw=float(_field(data, "busbw", (int, float), where)),
        )


@dataclass(frozen=True)
class Calibration:
    """What the ranks measured: collectives at the model's message sizes and memory bandwidth.

    `memory_bandwidth` is a large device copy's bytes read + written per second; `latency_s` the
    smallest-message all-gather time (launch and synchronisation included);
    `fresh_copy_bandwidth` the same copy into a newly allocated tensor, what FSDP2's copies into
    new buffers cost (0: not measured, use `memory_bandwidth`); `overlap` the share of the
    shorter of (a large all-gather, host-issued small kernels) that is hidden when both run at
    once, in [0, 1] (0: not measured, nothing hidden); `p2p` one send/recv hop at each size
    (empty: not measured). `nodes`: the nodes the ranks span (> 1: every figure above crossed
    the network); `within_node`: the same collectives among one node's ranks (None: not
    measured, or one rank per node), with this calibration's device figures.
    `in_step_latency_s`: what one small all-reduce costs issued between bursts of host compute
    with no barrier before it, the ranks' drift and wake-up included (0: not measured; where
    kernels queue on a device, not measured).
    """

    world_size: int
    backend: str
    device_type: str
    all_gather: tuple[CollectiveFigure, ...]
    all_reduce: tuple[CollectiveFigure, ...]
    memory_bandwidth: float
    latency_s: float
    fresh_copy_bandwidth: float = 0.0
    overlap: float = 0.0
    p2p: tuple[CollectiveFigure, ...] = ()
    nodes: int = 1
    within_node: Calibration | None = None
    in_step_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"calibration: overlap must be in [0, 1], got {self.overlap!r}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"calibration: nodes must be an integer >= 1, got {self.nodes!r}")
        inner = self.within_node
        if inner is not None and (self.nodes == 1 or inner.nodes != 1):
            raise ValueError("calibration: within_node belongs to a job over several nodes")
        # Sorted by size so that interpolation can bisect; tuples whatever the caller passed.
        for op in OPS:
            figures = tuple(sorted(getattr(self, op), key=lambda f: f.bytes))
            if any(f.op != op for f in figures):
                raise ValueError(f"calibration: a figure in {op} is not an {op}")
            object.__setattr__(self, op, figures)

    @property
    def scope(self) -> str:
        """The links its figures crossed: one node's ("node") or the network's ("network")."""
        return NETWORK_SCOPE if self.nodes > 1 else NODE_SCOPE

    def figures(self, op: str) -> tuple[CollectiveFigure, ...]:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
        return getattr(self, op)

    def time_at(self, op: str, nbytes: float) -> float:
        """Time of one `op` of `nbytes` at this world size, interpolated between measured sizes.

        Linear in bytes between two measured sizes (t = latency + bytes / bandwidth holds
        piecewise); below the smallest size, the smallest size's time; above the largest, the
        largest size's time plus the extra bytes at the faster of that size's algorithm
        bandwidth and the best bus bandwidth any collective reached on these links: a largest
        size that is all latency (a small all-reduce) says nothing of the bandwidth.
        """
        figures = self.figures(op)
        if not figures:
            raise ValueError(f"calibration has no {op} figures")
        sizes = [f.bytes for f in figures]
        if nbytes <= sizes[0]:
            return figures[0].time_s
        last = figures[-1]
        if nbytes >= sizes[-1]:
            rate = max(last.algbw, self.best_algbw(op))
            return last.time_s + ((nbytes - last.bytes) / rate if rate > 0 else 0.0)
        i = bisect.bisect_right(sizes, nbytes)
        lo, hi = figures[i - 1], figures[i]
        share = (nbytes - lo.bytes) / (hi.bytes - lo.bytes)
        return lo.time_s + share * (hi.time_s - lo.time_s)

    def best_algbw(self, op: str) -> float:
        """The algorithm bandwidth (bytes/s) an `op` would reach at the best bus bandwidth any
        measured collective reached (nccl-tests' busbw is the links' share, the same measure
        for every kind); 0 where none was measured or the op moves nothing on one rank."""
        best = max((f.busbw for kind in OPS for f in self.figures(kind)), default=0.0)
        factor = bus_factor(op, self.world_size)
        return best / factor if factor > 0 else 0.0

    def busbw_at(self, op: str, nbytes: float) -> float:
        """Bus bandwidth (bytes/s) of an `op` of `nbytes`, latency included, as nccl-tests shows."""
        t = self.time_at(op, nbytes)
        return nbytes / t * bus_factor(op, self.world_size) if t > 0 else 0.0

    def merged(self, newer: Calibration) -> Calibration:
        """This calibration with `newer`'s collectives at the sizes it lacks (a builder's model,
        calibrated once built); the device figures (bandwidth, latency, overlap) stay its own."""
        figures = {}
        for op in OPS:
            sizes = {f.bytes for f in self.figures(op)}
            added = tuple(f for f in newer.figures(op) if f.bytes not in sizes)
            figures[op] = self.figures(op) + added
        inner = self.within_node
        if inner is None or newer.within_node is None:
            inner = inner or newer.within_node
        else:
            inner = inner.merged(newer.within_node)
        in_step = self.in_step_latency_s or newer.in_step_latency_s
        return dataclasses.replace(self, **figures, within_node=inner, in_step_latency_s=in_step)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "world_size": self.world_size,
            "backend": self.backend,
            "device_type": self.device_type,
            "all_gather": [f.to_dict() for f in self.all_gather],
            "all_reduce": [f.to_dict() for f in self.all_reduce],
            "memory_bandwidth": self.memory_bandwidth,
            "latency_s": self.latency_s,
            "fresh_copy_bandwidth": self.fresh_copy_bandwidth,
            "overlap": self.overlap,
            "p2p": [f.to_dict() for f in self.p2p],
            "in_step_latency_s": self.in_step_latency_s,
        }
        if self.nodes > 1:  # a single node's calibration is written as it always was
            inner = self.within_node
            data |= {"nodes": self.nodes, "scope": self.scope, "within_node": None}
            if inner is not None:
                data["within_node"] = {**inner.to_dict(), "scope": NODE_SCOPE}
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        """Inverse of `to_dict`; raises ValueError naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"calibration: expected a JSON object, got {type(data).__name__}")
        if data.get("scope", NODE_SCOPE) not in (NODE_SCOPE, NETWORK_SCOPE):
            raise ValueError(f"calibration: unknown scope {data['scope']!r}")
        inner = data.get("within_node")
        figures = {}
        for op in OPS:
            if op in OPTIONAL_OPS and op not in data:
                figures[op] = ()
                continue
            raw = _field(data, op, (list, tuple), "calibration")
            figures[op] = tuple(
                CollectiveFigure.from_dict(
                    _mapping(item, f"calibration {op}[{i}]"), f"calibration {op}[{i}]"
                )
                for i, item in enumerate(raw)
            )
        return cls(
            world_size=int(_field(data, "world_size", (int,), "calibration")),
            backend=_field(data, "backend", str, "calibration"),
            device_type=_field(data, "device_type", str, "calibration"),
            all_gather=figures["all_gather"],
            all_reduce=figures["all_reduce"],
            memory_bandwidth=_number(data, "memory_bandwidth"),
            latency_s=_number(data, "latency_s"),
            fresh_copy_bandwidth=_number(data, "fresh_copy_bandwidth", 0.0),
            # Reports written before the overlap was measured: nothing hidden, terms add up.
            overlap=_number(data, "overlap", 0.0),
            p2p=figures["p2p"],
            nodes=int(_field(data, "nodes", (int,), "calibration")) if "nodes" in data else 1,
            in_step_latency_s=_number(data, "in_step_latency_s", 0.0),
            within_node=None if inner is None else cls.from_dict(_within_node(inner)),
        )


def _within_node(value: Any) -> Mapping[str, Any]:
    data = _mapping(value, "calibration within_node")
    if data.get("scope", NODE_SCOPE) != NODE_SCOPE:
        raise ValueError(f"calibration within_node: scope must be {NODE_SCOPE!r}")
    return data


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _number(data: Mapping[str, Any], name: str, absent: float | None = None) -> float:
    """A figure of the calibration; `absent` where reports written before it lack it."""
    if absent is not None and name not in data:
        return absent
    return float(_field(data, name, (int, float), "calibration"))


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in data:
        raise ValueError(f"{where}: missing field {name!r}")
    value = data[name]
    # JSON true is an int in Python; a boolean where a number belongs is a mistake worth naming.
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: field {name!r} has the wrong type ({value!r})")
    return value


@dataclass(frozen=True)
class MessageSizes:
    """Byte sizes to calibrate: all-gather OUTPUT sizes, all-reduce sizes and point-to-point
    message sizes (measured only when a strategy asks for them)."""

    all_gather: tuple[int, ...]
    all_reduce: tuple[int, ...]
    p2p: tuple[int, ...] = ()

    def up_to(self, max_bytes: int | None) -> MessageSizes:
        """The sizes of at most `max_bytes` (None: all), each kind keeping its smallest."""
        if max_bytes is None:
            return self

        def kept(sizes: tuple[int, ...]) -> tuple[int, ...]:
            small = tuple(s for s in sizes if s <= max_bytes)
            return small or tuple(sorted(sizes)[:1])

        return MessageSizes(kept(self.all_gather), kept(self.all_reduce), kept(self.p2p))


NO_MESSAGES = MessageSizes((), ())
LATENCY_PROBE_BYTES = 4096  # small enough to be latency-bound on every link we know of
