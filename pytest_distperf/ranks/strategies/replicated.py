"""Rank halves of the replicated strategies (`auto`, `ddp`): Fabric's own wrappers."""

from __future__ import annotations

from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.strategies.half import RankStrategy

HALVES = tuple(
    RankStrategy(name, build=build, describe_sharding=lambda fabric, module: "replicated")
    for name, build in (
        ("auto", lambda context: "auto"),  # Fabric's choice: DDP for several devices, else one
        ("ddp", lambda context: fabric_module("strategies").DDPStrategy()),
    )
)
