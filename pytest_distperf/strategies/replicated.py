"""Replicated strategies: every rank holds the whole model (`auto`, `ddp`).

DDP communicates in backward only, so an inference forward has no collective; the worker makes
the KV caches after wrapping, so there is no buffer broadcast either (docs/perfmodel.md). A
training step all-reduces every gradient in DDP's buckets while backward runs. The rank half:
`pytest_distperf.ranks.strategies.replicated`.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import NO_MESSAGES, MessageSizes
from pytest_distperf.perfmodel.step import Collective, StepCost
from pytest_distperf.perfmodel.terms import MB
from pytest_distperf.perfmodel.train import BACKWARD_SHARE
from pytest_distperf.strategies.record import CPU_AND_CUDA, StrategyRecord, data_parallel

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import StepInput

MIB = 1024 * 1024
# DDP's default bucket_cap_mb=25 (MiB), and the smaller first bucket its reducer rebuilds with
# after the first step (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), so that the all-reduce
# of the last layers' gradients starts early.
DDP_BUCKET_BYTES = 25 * MIB
DDP_FIRST_BUCKET_BYTES = 1 * MIB


def ddp_buckets(total_bytes: int) -> list[int]:
    """DDP's gradient buckets in the order backward fills them: the first bucket, then full
    ones, then the rest (the embedding's, ready last). Whole parameters per bucket in DDP; the
    shape has no parameter list, so bytes are cut at the caps exactly."""
    first = min(total_bytes, DDP_FIRST_BUCKET_BYTES)
    sizes = [first] if first else []
    rest = total_bytes - first
    while rest > 0:
        sizes.append(min(rest, DDP_BUCKET_BYTES))
        rest -= sizes[-1]
    return sizes


def _gradient_bytes(config: ModelShape, param_bytes: int) -> int:
    # DDP reduces the gradients in the parameters' own dtype (float32 under bf16-mixed).
    params = config.n_layer * config.block_param_count() + config.non_block_param_count()
    return params * param_bytes


def cost(x: StepInput) -> StepCost:
    """Decode: no collective (DDP communicates in backward only). Training: DDP's gradient
    all-reduce of every parameter, bucket by bucket, during backward; on one device (Fabric's
    single-device strategy) no collective at all."""
    if not x.training:
        block = x.shape.block_param_count() * x.comm_bytes
        notes = ("replicated: no collective in an inference forward",)
        return StepCost("replicated", (), ("all_gather", block), notes)
    if x.devices == 1:
        notes = ("one device: no gradient all-reduce",)
        return StepCost("one device", (), ("all_gather", 0), notes)
    total = _gradient_bytes(x.shape, x.param_bytes)
    buckets = ddp_buckets(total)
    # the last bucket starts when backward ends: nothing runs beside it
    reductions = tuple(
        Collective("all_reduce", size, overlappable=i < len(buckets) - 1, term="grad_all_reduce")
        for i, size in enumerate(buckets)
    )
    return StepCost(
        "DDP",
        reductions,
        ("all_reduce", max(buckets)),
        (
            f"DDP: every gradient all-reduced once per step, {total / MB:.4g} MB in "
            f"{len(buckets)} buckets ({DDP_FIRST_BUCKET_BYTES // MIB} MiB first, then "
            f"{DDP_BUCKET_BYTES // MIB} MiB: bucket_cap_mb's default)",
            "DDP: buckets all-reduce during backward as they fill (backward = 2/3 of the "
            "compute); the last bucket starts when backward ends, so nothing hides it",
        ),
        hidden_behind=BACKWARD_SHARE,
    )


def _no_messages(config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes:
    return NO_MESSAGES


_replicated = partial(
    StrategyRecord,
    family="replicated",
    sharded=False,
    cost=cost,
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
