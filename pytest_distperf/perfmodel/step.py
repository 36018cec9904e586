"""One step of one rank, decode and training alike: what a strategy's cost receives (`StepInput`)
and returns (`StepCost`), the interface its record implements (`StrategyModel`), and the counted
collectives charged in place of the expected ones."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.calibration import MessageSizes
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.terms import Overheads

#: kind -> (calls, bytes) per decode token (a training step: per step), bytes in nccl-tests'
#: convention (all calls together), as the ranks count them (pytest_distperf/work.py)
Collectives = Mapping[str, tuple[float, float]]

# The calibrated figures that time each collective kind: a ring reduce-scatter moves what an
# all-gather of the same size moves, (n-1)/n of its bytes through each link. A "p2p" hop is
# timed as one (Links.hop_time); its counts are one rank's and do not show a chain's length.
CHARGED_AS = {
    "all_gather": "all_gather",
    "all_reduce": "all_reduce",
    "reduce_scatter": "all_gather",
}
SAME_BYTES = 0.01  # counts are exact; bytes may differ by rounding to whole elements per rank


@dataclass(frozen=True)
class StepInput:
    """One step of one data-parallel rank: a decode step is one forward of `batch_size` rows of
    one token over a KV cache of `seq_length`; a training step a forward and a backward of
    `batch_size` sequences of `seq_length` tokens."""

    shape: ModelShape
    devices: int
    device_type: str  # "cuda" or "cpu": a strategy may be built differently on each
    batch_size: int
    seq_length: int
    param_bytes: int  # per parameter
    comm_bytes: int  # per element the collectives move (training under bf16-mixed: 2)
    links: Links
    overheads: Overheads
    training: bool = False

    @property
    def passes(self) -> int:
        return 2 if self.training else 1

    @property
    def tokens_per_row(self) -> int:  # one per decode step, the whole sequence in training
        return self.seq_length if self.training else 1


@dataclass(frozen=True)
class Collective:
    """`calls` collectives of one kind, `bytes` of them all together (an all-gather's gathered
    output). Not `overlappable`: nothing runs beside it (the first gather, the last reduction)."""

    kind: str  # "all_gather", "all_reduce", "reduce_scatter" or "p2p" (a hop between two ranks)
    bytes: float
    calls: float = 1
    overlappable: bool = True
    term: str = ""  # the term that charges it (default: its kind; DDP: "grad_all_reduce")
    across_nodes: bool = False  # a p2p hop between two nodes of a job

    @property
    def charged_to(self) -> str:
        return self.term or self.kind


@dataclass(frozen=True)
class StepCost:
    """A strategy's own share of one step beyond the compute: its collectives in issue order, and
    its wrapper's host work (`units` x `unit_s` a pass, `collective_s` a gather or reduction)."""

    implementation: str
    collectives: tuple[Collective, ...]
    message: tuple[str, float]  # (op, bytes) of the bus bandwidth the prediction reports
    assumptions: tuple[str, ...] = ()
    units: int = 0
    unit_s: float = 0.0
    collective_s: float = 0.0
    copies: bool = False  # copies in and out of the gathers' and reductions' buffers
    moved: dict[str, float] = field(default_factory=dict)  # bytes beyond the collectives'
    # Share of the single-rank compute (tensor parallel: its shard of the weights) and of the
    # optimizer's update (sharded: its shard) this rank does; of the compute the transfers may
    # hide behind (DDP: the backward; 0: none, each is the next operation's input).
    compute_share: float = 1.0
    optimizer_share: float = 1.0
    hidden_behind: float = 1.0


@dataclass(frozen=True)
class StepWork:
    """A step's single-rank work before any strategy."""

    terms: dict[str, float]
    moved: dict[str, float]
    notes: tuple[str, ...]
    # A decode's measured prefill: (its seconds, one step's, the tokens its excess is spread over).
    prefill: tuple[float, float, int] | None = None


@runtime_checkable
class StrategyModel(Protocol):
    """A strategy as the predictions see it; `strategies.StrategyRecord` implements it."""

    @property
    def name(self) -> str: ...

    @property
    def train_refusal(self) -> str: ...  # why it cannot train ("": it can)

    @property
    def runs_on(self) -> frozenset[str]: ...  # the accelerators it builds on

    def cost(self, x: StepInput) -> StepCost: ...  # its share of a decode or training step

    def replicas(self, devices: int) -> int: ...  # independent decode streams on `devices`

    # The collective sizes worth calibrating for this model's decode under it.
    def message_sizes(self, config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes: ...


def expected_collectives(cost: StepCost) -> dict[str, tuple[float, float]]:
    """What `cost` charges per token (training: per step) by kind, a pipeline's as "send/recv"."""
    kinds: dict[str, tuple[float, float]] = {}
    for c in cost.collectives:
        kind = "send/recv" if c.kind == "p2p" else c.kind
        calls, nbytes = kinds.get(kind, (0, 0.0))  # whole calls stay ints in JSON
        kinds[kind] = (calls + c.calls, nbytes + c.bytes)
    return kinds


def charged_collectives(
    cost: StepCost, counted: Collectives, per: str
) -> tuple[tuple[Collective, ...], tuple[str, ...]]:
    """The collectives to charge: the counted ones (not a pipeline's hops) where they differ from
    what `cost` charges, under its terms' names, with a note saying so (docs/perfmodel.md)."""
    charged = {k: v for k, v in counted.items() if k in CHARGED_AS and v[0] > 0}
    expected = {k: v for k, v in expected_collectives(cost).items() if k in CHARGED_AS}
    if _same_collectives(expected, charged):
        return cost.collectives, ()
    terms = {c.kind: c.charged_to for c in cost.collectives}
    kept = tuple(c for c in cost.collectives if c.kind not in CHARGED_AS)
    added = tuple(
        Collective(kind, nbytes, calls, term=terms.get(kind, kind))
        for kind, (calls, nbytes) in sorted(charged.items())
    )
    note = (
        f"collectives as counted in this run's ranks ({describe(charged)} per {per}), not as "
        f"the strategy's model expects ({describe(expected) or 'none'})"
    )
    return kept + added, (note,)


def describe(collectives: Collectives) -> str:
    """E.g. "all_gather 7 x 8.04 MB, all_reduce 6 x 64 B" (bytes per call)."""
    return ", ".join(
        f"{kind} {calls:g} x {_size(nbytes / calls if calls else 0.0)}"
        for kind, (calls, nbytes) in sorted(collectives.items())
    )


def _same_collectives(expected: Collectives, counted: Collectives) -> bool:
    """The same kinds, calls and (within `SAME_BYTES`) bytes."""
    return expected.keys() == counted.keys() and all(
        calls == counted[kind][0] and abs(counted[kind][1] - nbytes) <= SAME_BYTES * max(nbytes, 1)
        for kind, (calls, nbytes) in expected.items()
    )


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
