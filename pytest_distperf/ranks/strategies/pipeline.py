"""Rank half of `pipeline`: Fabric only launches and fences the ranks; the model is split into
stages (`distperf_model.parallelize.PipelineStage`) that decode across the ranks."""

from __future__ import annotations

from typing import Any

from distperf_model.parallelize import PipelineStage

from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy


def _build(context: BuildContext) -> Any:
    return "auto"  # only launches the ranks and gives the barrier; the model is not set up


def _wrap(model: Any, context: BuildContext) -> Any:
    return PipelineStage(model, context.rank, context.devices, context.comm_delay_s)


def _next_token(module: Any, idx: Any, input_pos: Any) -> Any:
    return module.next_token(idx, input_pos)


def _describe_sharding(fabric: Any, module: Any) -> str:
    return module.describe()


HALVES = (
    RankStrategy(
        "pipeline",
        build=_build,
        describe_sharding=_describe_sharding,
        wrap=_wrap,
        next_token=_next_token,
    ),
)
