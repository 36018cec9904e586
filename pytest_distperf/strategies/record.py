"""One strategy, one pure record implementing `perfmodel.step.StrategyModel`; its rank half is
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
    """Every rank decodes its own stream."""
    return devices


def model_parallel(devices: int) -> int:
    """All ranks decode one stream together."""
    return 1


def fits_any(config: ModelShape, devices: int) -> str | None:
    return None


@dataclass(frozen=True)
class StrategyRecord:
    """What the plugin and the performance model know of a strategy (docs/extending.md, "Pure
    record"). `decodes_across_ranks`: no rank holds the logits, so the rank half steps the
    decode (no user `generate=` loop, no compiled step); `changes_what_runs`: the wrapped model
    runs other work than the bare one, so its relative speed is measured by default."""

    name: str
    description: str
    sharded: bool  # parameters sharded across ranks: the whole model exists only before wrapping
    cost: Callable[[StepInput], StepCost]  # its share of a decode or training step
    message_sizes: Callable[[ModelShape, int, int], MessageSizes]  # (config, dtype_bytes, batch)
    replicas: Callable[[int], int] = data_parallel  # independent decode streams on N ranks
    runs_on: frozenset[str] = CPU_AND_CUDA  # accelerators it can be built on
    min_ranks: int = 1  # one rank is the whole model, as every strategy on one device
    check: Callable[[ModelShape, int], str | None] = fits_any  # why N ranks cannot split it
    decodes_across_ranks: bool = False
    train_refusal: str = ""  # why it cannot train ("": it can)
    changes_what_runs: bool = False

    def measures_relative_speed(self, asked: bool, devices: int) -> bool:
        """Whether a run times the bare model beside its repeats: on request (`asked`), or where
        it changes what runs over two or more ranks."""
        return asked or (self.changes_what_runs and devices > 1)

    def unsupported(self, accelerator: str, devices: int) -> str | None:
        """Why this strategy cannot run on `devices` x `accelerator`, or None when it can."""
        if accelerator not in self.runs_on:
            where = ", ".join(sorted(self.runs_on))
            return f"strategy {self.name!r} runs on {where}, not on {accelerator!r}"
        if devices < self.min_ranks:
            return f"strategy {self.name!r} needs at least {self.min_ranks} ranks, got {devices}"
        return None
