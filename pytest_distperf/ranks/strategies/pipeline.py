"""Rank half of `pipeline`: Fabric only launches and fences the ranks; the model is split into
stages (`distperf_model.parallelize.PipelineStage`) that decode across the ranks."""

from __future__ import annotations

from typing import Any

from distperf_model.parallelize import PipelineStage

from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy


def _wrap(model: Any, context: BuildContext) -> Any:
    return PipelineStage(model, context.rank, context.devices, context.comm_delay_s)


HALVES = (
    RankStrategy(
        "pipeline",
        build=lambda context: "auto",  # launches the ranks, gives the barrier; sets nothing up
        describe_sharding=lambda fabric, module: module.describe(),
        wrap=_wrap,
        next_token=lambda module, idx, input_pos: module.next_token(idx, input_pos),
    ),
)
