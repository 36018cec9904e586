"""Replicated strategies: every rank holds the whole model (`auto`, `ddp`).

DDP communicates in backward only, so an inference forward has no collective; the worker makes
the KV caches after wrapping, so there is no buffer broadcast either (docs/perfmodel.md). The
rank half: `pytest_distperf.ranks.strategies.replicated`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import NO_MESSAGES
from pytest_distperf.perfmodel.cost import StrategyCost
from pytest_distperf.strategies.record import CPU_AND_CUDA, StrategyRecord, data_parallel

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.calibration import MessageSizes
    from pytest_distperf.perfmodel.cost import StrategyInput
    from pytest_distperf.perfmodel.shape import ModelShape


def replicated_cost(x: StrategyInput) -> StrategyCost:
    """No per-token term beyond the compute: also every strategy's cost on one device."""
    return StrategyCost(
        "replicated",
        {},
        {},
        0,
        x.config.block_param_count() * x.dtype_bytes,
        ("replicated: no collective in an inference forward",),
    )


def _no_messages(config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes:
    return NO_MESSAGES


_replicated = partial(
    StrategyRecord,
    family="replicated",
    sharded=False,
    cost=replicated_cost,
    replicas=data_parallel,
    message_sizes=_no_messages,
    runs_on=CPU_AND_CUDA,
    min_ranks=1,
)

RECORDS = (
    _replicated(
        name="auto",
        description="Fabric's default: DDP for N > 1, every rank holds the model",
    ),
    _replicated(
        name="ddp",
        description="explicit DDP: every rank holds the whole model",
    ),
)
