"""One strategy, one pure record: what a step costs it, what it calibrates, where it runs. No
torch, not even lazily; it implements `perfmodel.step.StrategyModel`, and its rank half is
registered under the same name in `pytest_distperf.ranks.strategies` (docs/extending.md)."""

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
    return None


@dataclass(frozen=True)
class StrategyRecord:
    """Everything the plugin and the performance model need to know of a strategy; each field's
    role: docs/extending.md ("Pure record").

    `check(config, devices)`: why the model cannot be split over `devices` ranks, or None.
    `decodes_across_ranks`: no rank holds the logits to sample from, so the rank half steps the
    decode itself (pipeline) and no user `generate=` loop or compiled step can run.
    `changes_what_runs`: the wrapped model runs other work than the bare one (sharded storage, a
    split model), so its relative speed is measured by default, elsewhere on request only.
    """

    name: str
    description: str
    family: str  # the module that defines it: "replicated", "fsdp", ...
    sharded: bool  # parameters sharded across ranks: the whole model exists only before wrapping
    cost: Callable[[StepInput], StepCost]  # its share of a decode or training step
    replicas: Callable[[int], int]  # independent decode streams on `devices` ranks
    message_sizes: Callable[[ModelShape, int, int], MessageSizes]  # (config, dtype_bytes, batch)
    runs_on: frozenset[str]  # accelerators it can be built on
    min_ranks: int
    check: Callable[[ModelShape, int], str | None] = fits_any
    decodes_across_ranks: bool = False
    train_refusal: str = ""  # why it cannot train ("": it can)
    changes_what_runs: bool = False

    def measures_relative_speed(self, asked: bool, devices: int) -> bool:
        """Whether a run times the bare model beside its repeats (`asked`: option or marker): by
        default where it changes what runs over two or more ranks (one rank splits nothing)."""
        return asked or (self.changes_what_runs and devices > 1)

    def unsupported(self, accelerator: str, devices: int) -> str | None:
        """Why this strategy cannot run on `devices` x `accelerator`, or None when it can."""
        if accelerator not in self.runs_on:
            where = ", ".join(sorted(self.runs_on))
            return f"strategy {self.name!r} runs on {where}, not on {accelerator!r}"
        if devices < self.min_ranks:
            return f"strategy {self.name!r} needs at least {self.min_ranks} ranks, got {devices}"
        return None
