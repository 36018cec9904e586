"""Replicated strategies, every rank holding the whole model (`auto`, `ddp`): no collective in
an inference forward (DDP communicates in backward only, and the KV caches are made after
wrapping: no buffer broadcast); a training step all-reduces the gradients in DDP's buckets."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import NO_MESSAGES
from pytest_distperf.perfmodel.step import Collective, StepCost
from pytest_distperf.perfmodel.terms import MB
from pytest_distperf.perfmodel.train import BACKWARD_SHARE
from pytest_distperf.strategies.record import StrategyRecord

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.step import StepInput

MIB = 1024 * 1024
# DDP's default bucket_cap_mb=25 (MiB), and the smaller first bucket its reducer rebuilds with
# after the first step (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
DDP_BUCKET_BYTES = 25 * MIB
DDP_FIRST_BUCKET_BYTES = 1 * MIB


def ddp_buckets(total_bytes: int) -> list[int]:
    """DDP's gradient buckets in the order backward fills them, cut at the caps exactly."""
    first = min(total_bytes, DDP_FIRST_BUCKET_BYTES)
    sizes = [first] if first else []
    rest = total_bytes - first
    while rest > 0:
        sizes.append(min(rest, DDP_BUCKET_BYTES))
        rest -= sizes[-1]
    return sizes


def cost(x: StepInput) -> StepCost:
    if not x.training:
        block = x.shape.block_param_count() * x.comm_bytes
        notes = ("replicated: no collective in an inference forward",)
        return StepCost("replicated", (), ("all_gather", block), notes)
    if x.devices == 1:  # Fabric's single-device strategy
        notes = ("one device: no gradient all-reduce",)
        return StepCost("one device", (), ("all_gather", 0), notes)
    # DDP reduces the gradients in the parameters' own dtype (float32 under bf16-mixed).
    params = x.shape.n_layer * x.shape.block_param_count() + x.shape.non_block_param_count()
    total = params * x.param_bytes
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


_replicated = partial(
    StrategyRecord,
    sharded=False,
    cost=cost,
    message_sizes=lambda config, dtype_bytes, batch: NO_MESSAGES,
)

RECORDS = (
    _replicated(
        name="auto", description="Fabric's default: DDP for N > 1, every rank holds the model"
    ),
    _replicated(name="ddp", description="explicit DDP: every rank holds the whole model"),
)
