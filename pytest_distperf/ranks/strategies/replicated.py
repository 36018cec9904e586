"""Rank halves of the replicated strategies (`auto`, `ddp`): Fabric's own wrappers."""

from __future__ import annotations

from typing import Any

from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy


def _build_ddp(context: BuildContext) -> Any:
    return fabric_module("strategies").DDPStrategy()


def _sharding(fabric: Any, module: Any) -> str:
    return "replicated"


HALVES = (
    # Fabric's own choice: DDP for several devices, single device for one.
    RankStrategy("auto", build=lambda context: "auto", describe_sharding=_sharding),
    RankStrategy("ddp", build=_build_ddp, describe_sharding=_sharding),
)
