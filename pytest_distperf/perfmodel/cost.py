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
