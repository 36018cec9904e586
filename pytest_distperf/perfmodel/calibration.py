"""Calibration values measured in the ranks (ranks/calibrate.py) and the message sizes worth
measuring, in nccl-tests' conventions (doc/PERFORMANCE.md): an all-gather's `bytes` is its
OUTPUT size; algbw = bytes / time; busbw = algbw x `bus_factor`; a point-to-point hop ("p2p")
is nccl-tests' sendrecv (every rank sends to the next, receives from the one before)."""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Any

from pytest_distperf.jsonfields import NUMBER, get_field, json_object

OPS = ("all_gather", "all_reduce", "p2p")
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
    def from_dict(cls, value: Any, where: str) -> CollectiveFigure:
        data = json_object(value, where)
        op = get_field(data, "op", str, where)
        if op not in OPS:
            raise ValueError(f"{where}: unknown op {op!r}")
        times = (float(get_field(data, k, NUMBER, where)) for k in ("time_s", "algbw", "busbw"))
        return cls(op, get_field(data, "bytes", int, where), *times)


@dataclass(frozen=True)
class Calibration:
    """What the ranks measured (0: not measured): collectives at the model's message sizes, and
    the device's figures. Over `nodes` > 1 every collective figure crossed the network."""

    world_size: int
    backend: str
    device_type: str
    all_gather: tuple[CollectiveFigure, ...]
    all_reduce: tuple[CollectiveFigure, ...]
    memory_bandwidth: float  # a large device copy's bytes read + written per second
    latency_s: float  # the smallest all-gather, launch and sync included
    fresh_copy_bandwidth: float = 0.0  # a copy into a new tensor: what FSDP2's copies cost
    # The share of the shorter of (a large all-gather, host-issued small kernels) hidden when
    # both run at once.
    overlap: float = 0.0
    p2p: tuple[CollectiveFigure, ...] = ()
    nodes: int = 1
    within_node: Calibration | None = None  # among one node's ranks (None: one rank per node)
    # A small all-reduce issued between bursts of host compute with no barrier before it, the
    # ranks' drift included.
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
        return NETWORK_SCOPE if self.nodes > 1 else NODE_SCOPE

    def figures(self, op: str) -> tuple[CollectiveFigure, ...]:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")
        return getattr(self, op)

    def time_at(self, op: str, nbytes: float) -> float:
        """One `op` of `nbytes`: linear between measured sizes, the smallest's time below them;
        above, the extra bytes at the faster of the largest's algbw and `best_algbw` (the
        largest size may be all latency)."""
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
        """The algbw an `op` reaches at the best busbw any measured collective reached (busbw is
        the links' share, the same for every kind); 0 where none was measured."""
        best = max((f.busbw for kind in OPS for f in self.figures(kind)), default=0.0)
        factor = bus_factor(op, self.world_size)
        return best / factor if factor > 0 else 0.0

    def busbw_at(self, op: str, nbytes: float) -> float:
        """Bus bandwidth (bytes/s) of an `op` of `nbytes`, latency included, as nccl-tests shows."""
        t = self.time_at(op, nbytes)
        return nbytes / t * bus_factor(op, self.world_size) if t > 0 else 0.0

    def merged(self, newer: Calibration) -> Calibration:
        """This calibration with `newer`'s collectives at the sizes it lacks (a builder's model,
        calibrated once built); the device figures stay its own."""
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
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data |= {op: [f.to_dict() for f in self.figures(op)] for op in OPS}
        inner = data.pop("within_node")
        if self.nodes == 1:  # a single node's calibration is written as it always was
            del data["nodes"]
        else:
            within = None if inner is None else {**inner.to_dict(), "scope": NODE_SCOPE}
            data |= {"scope": self.scope, "within_node": within}
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        """Inverse of `to_dict`; raises ValueError naming the bad field."""
        where = "calibration"
        data = json_object(data, where)
        if data.get("scope", NODE_SCOPE) not in (NODE_SCOPE, NETWORK_SCOPE):
            raise ValueError(f"calibration: unknown scope {data['scope']!r}")

        def number(name: str, **absent: float) -> float:
            return float(get_field(data, name, NUMBER, where, **absent))

        figures = {}
        for op in OPS:
            # p2p came after the first reports: absent reads as none measured
            raw = get_field(data, op, (list, tuple), where, optional=op == "p2p") or ()
            figures[op] = tuple(
                CollectiveFigure.from_dict(item, f"{where} {op}[{i}]") for i, item in enumerate(raw)
            )
        inner = data.get("within_node")
        if inner is not None:
            inner = json_object(inner, "calibration within_node")
            if inner.get("scope", NODE_SCOPE) != NODE_SCOPE:
                raise ValueError(f"calibration within_node: scope must be {NODE_SCOPE!r}")
            inner = cls.from_dict(inner)
        return cls(
            world_size=get_field(data, "world_size", int, where),
            backend=get_field(data, "backend", str, where),
            device_type=get_field(data, "device_type", str, where),
            memory_bandwidth=number("memory_bandwidth"),
            latency_s=number("latency_s"),
            # Figures measured after the first reports were written: absent reads as none.
            fresh_copy_bandwidth=number("fresh_copy_bandwidth", default=0.0),
            overlap=number("overlap", default=0.0),
            in_step_latency_s=number("in_step_latency_s", default=0.0),
            nodes=get_field(data, "nodes", int, where, default=1),
            within_node=inner,
            **figures,
        )


@dataclass(frozen=True)
class MessageSizes:
    """Byte sizes to calibrate (an all-gather's: its OUTPUT) of each collective."""

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
