"""One strategy, one pure record: what a step costs it, what it calibrates, where it runs.

No torch here, not even lazily: the plugin validates markers and the performance model predicts
from these records (they implement `perfmodel.step.StrategyModel`). How a rank builds, wraps and
steps the strategy is its rank half, registered under the same name in
`pytest_distperf.ranks.strategies`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.calibration import MessageSizes
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import StepCost, StepInput

CPU_AND_CUDA = frozenset({"cpu", "cuda"})


def data_parallel(devices: int) -> int:
    """Every rank decodes its own stream: as many independent streams as devices."""
    return devices


def model_parallel(devices: int) -> int:
    """All ranks decode one stream together (tensor or pipeline parallel over every rank)."""
    return 1


def fits_any(config: ModelShape, devices: int) -> str | None:
    """Any model splits over any number of ranks (data parallel, sharded storage)."""
    return None


@dataclass(frozen=True)
class StrategyRecord:
    """Everything the plugin and the performance model need to know of a strategy.

    `cost(x)` the strategy's own share of a decode or training step (`x.training`): its
    collectives and overheads (perfmodel.step); `replicas(devices)` how many independent decode
    streams the run has; `message_sizes(config, dtype_bytes, batch)` the collective sizes worth
    calibrating for that model's decode; `check(config, devices)` why the model
    cannot be split over `devices` ranks (the plugin asks at collection, the rank once built),
    or None. `decodes_across_ranks`: no rank holds the logits to sample from, so the rank half
    steps the decode itself (its `next_token`: pipeline) and no user `generate=` loop or compiled
    step can run; tensor parallel is False, every rank samples its whole logits.

    Training (perfmodel/train.py): `train_refusal` why it cannot train ("": it can, and `cost`
    takes a training step, whose collectives are the sizes to calibrate).

    `changes_what_runs`: the wrapped model runs other work than the bare one (sharded storage,
    a split model), so the bare model timed beside it measures the strategy's own cost; the
    relative speed is then measured by default (a replicated model is the bare one behind a
    forward wrapper: measured on request only, `--distperf-relative-speed`).
    """

    name: str
    description: str
    family: str  # the module that defines it: "replicated", "fsdp", ...
    sharded: bool  # parameters sharded across ranks: the whole model exists only before wrapping
    cost: Callable[[StepInput], StepCost]
    replicas: Callable[[int], int]
    message_sizes: Callable[[ModelShape, int, int], MessageSizes]
    runs_on: frozenset[str]  # accelerators it can be built on
    min_ranks: int
    check: Callable[[ModelShape, int], str | None] = fits_any
    decodes_across_ranks: bool = False
    train_refusal: str = ""
    changes_what_runs: bool = False

    def measures_relative_speed(self, asked: bool) -> bool:
        """Whether a run times the bare model beside its repeats: by default where the strategy
        changes what runs, elsewhere when `asked` (the option or the marker's argument)."""
        return self.changes_what_runs or asked

    def unsupported(self, accelerator: str, devices: int) -> str | None:
        """Why this strategy cannot run on `devices` x `accelerator`, or None when it can."""
        if accelerator not in self.runs_on:
            where = ", ".join(sorted(self.runs_on))
            return f"strategy {self.name!r} runs on {where}, not on {accelerator!r}"
        if devices < self.min_ranks:
            return f"strategy {self.name!r} needs at least {self.min_ranks} ranks, got {devices}"
        return None
