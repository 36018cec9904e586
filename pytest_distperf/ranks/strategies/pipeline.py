"""Rank half of `pipeline`: Fabric only launches and fences the ranks; the model is split into
stages (`distperf_model.parallelize.PipelineStage`) that decode across the ranks."""

from __future__ import annotations

from distperf_model.parallelize import PipelineStage

from pytest_distperf.ranks.strategies.half import RankStrategy

HALVES = (
    RankStrategy(
        "pipeline",
        build=lambda context: "auto",  # launches the ranks, gives the barrier; sets nothing up
        describe_sharding=lambda fabric, module: module.describe(),
        wrap=lambda model, c: PipelineStage(model, c.rank, c.devices, c.comm_delay_s),
        next_token=lambda module, idx, input_pos: module.next_token(idx, input_pos),
    ),
)
