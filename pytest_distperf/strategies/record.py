"""One strategy, one record: how a rank builds it, what it costs per token, where it runs.

No torch here: the plugin validates markers and the performance model predicts from these
records without importing it. The callables that need torch or Lightning (`build`, `wrap`,
`next_token`, `describe_sharding`) import them when a rank calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distperf_model.config import Config

    from pytest_distperf.perfmodel.calibration import MessageSizes
    from pytest_distperf.perfmodel.terms import StrategyCost, StrategyInput

CPU_AND_CUDA = frozenset({"cpu", "cuda"})


@dataclass(frozen=True)
class BuildContext:
    """What a rank knows when it builds a strategy: the model is built, not yet wrapped."""

    accelerator: str  # "cpu" or "cuda"
    devices: int  # ranks in the run (all nodes)
    wrap_units: tuple[type, ...] = ()  # module classes to wrap or shard as one unit (blocks)
    rank: int = 0  # this rank's global rank
    tp_plan: str | None = None  # "package.module:function" from the marker, (model, tp_mesh)
    # Seconds added to every all-reduce or send the strategy itself issues: the self-check that
    # a communication-only slow-down fails the threshold (Workload.comm_delay).
    comm_delay_s: float = 0.0


def data_parallel(devices: int) -> int:
    """Every rank decodes its own stream: as many independent streams as devices."""
    return devices


def model_parallel(devices: int) -> int:
    """All ranks decode one stream together (tensor or pipeline parallel over every rank)."""
    return 1


def fits_any(config: Config, devices: int) -> str | None:
    """Any model splits over any number of ranks (data parallel, sharded storage)."""
    return None


@dataclass(frozen=True)
class StrategyRecord:
    """Everything the plugin, the ranks and the performance model need to know of a strategy.

    `build(context)` returns a Fabric strategy (or its name, e.g. "auto"); `cost(x)` the
    strategy's own per-token terms (perfmodel.terms); `replicas(devices)` how many independent
    decode streams the run has; `message_sizes(config, dtype_bytes, batch)` the collective sizes
    worth calibrating for that model; `describe_sharding(fabric, module)` how the wrapped module
    is really sharded, read from the module rather than assumed.

    Optional hooks for strategies that are no Fabric strategy or decode differently:
    `wrap(model, context)` returns the module to run, in place of Fabric's `setup_module`
    (`build` then only gives Fabric what launches the ranks); `next_token(module, idx,
    input_pos)` returns the next token [B, 1] on every rank, in place of sampling the module's
    logits; `check(config, devices)` says why the model cannot be split over `devices` ranks
    (the plugin asks at collection), or None.
    """

    name: str
    description: str
    family: str  # the module that defines it: "replicated", "fsdp", ...
    sharded: bool  # parameters sharded across ranks: the whole model exists only before wrapping
    build: Callable[[BuildContext], Any]
    cost: Callable[[StrategyInput], StrategyCost]
    replicas: Callable[[int], int]
    message_sizes: Callable[[Config, int, int], MessageSizes]
    runs_on: frozenset[str]  # accelerators it can be built on
    min_ranks: int
    describe_sharding: Callable[[Any, Any], str]
    wrap: Callable[[Any, BuildContext], Any] | None = None
    next_token: Callable[[Any, Any, Any], Any] | None = None
    check: Callable[[Config, int], str | None] = fits_any

    def unsupported(self, accelerator: str, devices: int) -> str | None:
        """Why this strategy cannot run on `devices` x `accelerator`, or None when it can."""
        if accelerator not in self.runs_on:
            where = ", ".join(sorted(self.runs_on))
            return f"strategy {self.name!r} runs on {where}, not on {accelerator!r}"
        if devices < self.min_ranks:
            return f"strategy {self.name!r} needs at least {self.min_ranks} ranks, got {devices}"
        return None

    def describe_implementation(self, fabric: Any, module: Any) -> tuple[str, str, str]:
        """(Fabric strategy class, sharding, wrapper class) of what actually ran in this rank."""
        inner = getattr(module, "_forward_module", module)
        sharding = self.describe_sharding(fabric, module)
        launcher = type(fabric.strategy).__name__
        if self.wrap is not None:  # Fabric launched the ranks; the record set the module up
            launcher += " (launch only)"
        return launcher, sharding, type(inner).__name__
