"""A strategy's rank half: how a rank builds, wraps and steps it, registered by name beside its
pure record (`pytest_distperf.strategies`). Ranks only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_distperf.platform import Platform


@dataclass(frozen=True)
class BuildContext:
    """What a rank knows when it builds a strategy: the model is built, not yet wrapped."""

    platform: Platform
    devices: int  # ranks in the run (all nodes)
    wrap_units: tuple[type, ...] = ()  # module classes to wrap or shard as one unit (blocks)
    rank: int = 0  # this rank's global rank
    tp_plan: str | None = None  # "package.module:function" from the marker, (model, tp_mesh)
    comm_delay_s: float = 0.0  # added to each all-reduce or send it issues (Workload.comm_delay)
    training: bool = False  # distperf(mode="train"): gradients flow through the wrapper


@dataclass(frozen=True)
class RankStrategy:
    """The rank half of the strategy `name` (docs/extending.md)."""

    name: str
    build: Callable[[BuildContext], Any]  # a Fabric strategy, or its name
    describe_sharding: Callable[[Any, Any], str]  # (fabric, module): read from the module
    wrap: Callable[[Any, BuildContext], Any] | None = None  # in place of Fabric's setup_module
    # (module, idx, input_pos) -> the next token [B, 1] on every rank (decodes_across_ranks)
    next_token: Callable[[Any, Any, Any], Any] | None = None
    # The modules after whose output decode sums over the ranks (ranks/collectives.py)
    collective_points: Callable[[Any], list[Any]] | None = None

    def describe_implementation(self, fabric: Any, module: Any) -> tuple[str, str, str]:
        """(Fabric strategy class, sharding, wrapper class) of what actually ran in this rank."""
        inner = getattr(module, "_forward_module", module)
        sharding = self.describe_sharding(fabric, module)
        launcher = type(fabric.strategy).__name__
        if self.wrap is not None:  # Fabric launched the ranks; the rank half set the module up
            launcher += " (launch only)"
        return launcher, sharding, type(inner).__name__
