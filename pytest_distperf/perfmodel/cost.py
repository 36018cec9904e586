"""What a strategy's cost side is to the performance model: the interface its pure record
implements (`StrategyModel`), what its cost function receives (`StrategyInput`) and returns
(`StrategyCost`). Pure; perfmodel names no strategy and imports none (the registry,
`pytest_distperf.strategies`, sits above both)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pytest_distperf.perfmodel.calibration import MessageSource

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.terms import Overheads


@dataclass(frozen=True)
class LocalMeasure:
    """Each rank's own decode, measured in the ranks after the timed repeats (CPU ranks:
    pytest_distperf/ranks/local.py), in rank order: the wrapped model with its collectives
    skipped over the bare whole model timed in turn with it (its share of the compute, hooks
    and dispatch included), for a step and for the prefill; and one replayed decode step with
    its real collectives and no barrier per step, beside the compute in it (None: no replay).
    `excess_s`: each rank's wrapped step less its bare one, where the wrapper's time adds to
    the bare model's instead of scaling it (None: the share scales it), at the host's speed of
    the timed repeats: `host_factors` (their host loop over the measure's, per rank) applied."""

    shares: tuple[float, ...]
    prefill_shares: tuple[float, ...] | None = None
    replay_step_s: tuple[float, ...] | None = None
    replay_compute_s: tuple[float, ...] | None = None
    excess_s: tuple[float, ...] | None = None
    host_factors: tuple[float, ...] | None = None

    def added_s(self, in_series: bool) -> float | None:
        """Seconds per step the wrapper adds to one whole model's step, where it adds: the
        stages' excesses summed where they run one after the other, else the largest."""
        if self.excess_s is None:
            return None
        return max(0.0, sum(self.excess_s) if in_series else max(self.excess_s))

    def share(self, in_series: bool) -> float:
        """The run's share of one whole model's step: the stages' summed where they run one
        after the other, else the slowest rank's."""
        return sum(self.shares) if in_series else max(self.shares)

    def prefill_share(self, in_series: bool) -> float | None:
        if not self.prefill_shares:
            return None
        shares = self.prefill_shares
        return sum(shares) if in_series else max(shares)

    def path_wait_s(self, in_series: bool) -> float | None:
        """Seconds per step the replayed collectives added to its compute: over every stage's
        compute where they run in turn (each rank's replay waits for the others' compute),
        else the most any rank's replay added to its own."""
        steps, computes = self.replay_step_s, self.replay_compute_s
        if steps is None or computes is None:
            return None
        if in_series:
            return max(0.0, max(steps) - sum(computes))
        return max(0.0, *(s - c for s, c in zip(steps, computes, strict=True)))


@dataclass(frozen=True)
class StrategyInput:
    """Everything a strategy's cost function may look at."""

    config: ModelShape
    devices: int
    device_type: str  # "cuda" or "cpu": a strategy may be built differently on each
    batch_size: int
    seq_length: int  # prompt + new tokens: the static KV cache's length
    dtype_bytes: int
    links: Links
    overheads: Overheads
    local: LocalMeasure | None = None  # CPU ranks: what each rank measured of its own decode


@dataclass(frozen=True)
class StrategyCost:
    """A strategy's own per-token terms, on top of the compute terms every strategy pays."""

    implementation: str
    terms: dict[str, float]
    bytes_per_token: dict[str, float]
    collectives: int  # per token
    message_bytes: float  # the dominant message size, for the bandwidth that is reported
    assumptions: tuple[str, ...] = ()
    # Share of the single-rank compute each rank still does per token (tensor parallel: its
    # shard of the weights); scales the measured `compute` or the roofline's `weights`.
    compute_share: float = 1.0
    # False when every transfer's result is the next operation's input (tensor-parallel
    # all-reduces, pipeline hops): nothing hides behind it, whatever the calibrated overlap.
    overlappable: bool = True
    message_op: str = "all_gather"  # the collective of `message_bytes` ("all_reduce", "p2p")
    # The ranks compute one after the other (pipeline stages): a measured share is their sum.
    stages_in_series: bool = False
    # Training (perfmodel/train.py; a decode cost leaves these alone), figures per step: the
    # share of the compute the transfers may hide behind (DDP: the backward), the transfer
    # seconds nothing hides (the first gather, the last bucket), the share of the parameters
    # whose AdamW update this rank runs (sharded: its shard), and kind -> (calls, bytes) of
    # every collective it charges (empty: `message_op` x `collectives`, as in decode).
    hidden_behind: float = 1.0
    exposed_s: float = 0.0
    optimizer_share: float = 1.0
    by_kind: dict[str, tuple[float, float]] = field(default_factory=dict)


@runtime_checkable
class StrategyModel(MessageSource, Protocol):
    """A strategy as `predict` and `message_sizes` see it; the pure strategy records
    (`pytest_distperf.strategies.StrategyRecord`) implement it."""

    @property
    def name(self) -> str: ...

    @property
    def sharded(self) -> bool:
        """Parameters sharded across ranks: the whole model exists only before wrapping."""
        ...

    def cost(self, x: StrategyInput) -> StrategyCost:
        """The strategy's own per-token terms, on top of the compute every strategy pays."""
        ...

    def replicas(self, devices: int) -> int:
        """Independent decode streams in a run on `devices` ranks."""
        ...


def path_terms(
    x: StrategyInput,
    count: int,
    transfer: float,
    latency: float,
    name: str,
    in_series: bool = False,
) -> tuple[dict[str, float], str]:
    """Terms of `count` collectives on the decode's path, each the next op's input: the replay
    measured in the ranks where there is one (latency as calibrated, the rest beyond it),
    else the calibrated transfer and latency. `in_series`: the ranks compute in turn."""
    wait = x.local.path_wait_s(in_series) if x.local is not None else None
    if wait is None:
        return {name: count * transfer, "latency": count * latency}, ""
    fenced = min(count * latency, wait)
    note = (
        f"{name}: {count} per step as a decode step issues them, replayed in the ranks between "
        f"bursts of the step's compute with no barrier ({wait * 1e3:.3g} ms per step; the "
        "waits for the peer and for a core are in it); latency as calibrated, the rest beyond"
    )
    return {name: wait - fenced, "latency": fenced}, note
