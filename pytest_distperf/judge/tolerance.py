"""How far a timed figure may move before its check says so: one rule on the recorded runs'
medians, which carry both the repeats' noise and the host's drift between sessions. Pure; why
each number is what it is: docs/gates.md ("The tolerance rule")."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Recorded runs a baseline needs before its medians measure the host's drift: fewer than
# three have no middle run to measure a drop from.
RUNS_TO_SETTLE = 3
# A settled tolerance is this many times the largest drop of any recorded run below their
# median: three runs rarely catch the host's worst session.
SAFETY = 3.0
# A drop beyond this fails from the first recorded run, whatever the runs showed.
GROSS_DROP = 0.5
# A provisional baseline's change within this host drift of its machine class is a note.
HOST_DRIFT = {"cpu": 0.40, "cuda": 0.20}
# The least settled tolerance of the throughput (by machine class), the relative speed and the
# device time per token; the least rise of the ranks' own off-CPU share that fails a slower run.
THROUGHPUT_FLOOR = {"cpu": 0.20, "cuda": 0.10}
RELATIVE_FLOOR = DEVICE_TIME_FLOOR = WAIT_SHARE_FLOOR = 0.05


@dataclass(frozen=True)
class Tolerance:
    """What a timed check allows: `fails` beyond it; `drift` the host's own (warns beyond
    while provisional); `runs` the recorded runs it came from."""

    fails: float
    drift: float
    runs: int
    explicit: bool = False  # --distperf-tolerance or the marker's: the user's own

    @property
    def provisional(self) -> bool:
        """Too few recorded runs to measure the drift: only a gross drop fails."""
        return not self.explicit and self.runs < RUNS_TO_SETTLE

    @property
    def runs_needed(self) -> int:
        return RUNS_TO_SETTLE - self.runs if self.provisional else 0


def largest_drop(run_medians: Sequence[float]) -> float:
    """The largest relative drop of any recorded run's median below the runs' median."""
    level = statistics.median(run_medians)
    return max(0.0, *(1.0 - m / level for m in run_medians))


def run_tolerance(
    run_medians: Sequence[float],
    floor: float,
    accelerator: str,
    explicit: float | None = None,
) -> Tolerance:
    """With RUNS_TO_SETTLE or more recorded runs, max(floor, SAFETY x the largest drop of any
    run below their median), never beyond GROSS_DROP; with fewer, GROSS_DROP. An explicit
    tolerance replaces it from the first run."""
    runs = len(run_medians)
    drift = HOST_DRIFT.get(accelerator, HOST_DRIFT["cpu"])
    if explicit is not None:  # options.py checked it
        return Tolerance(explicit, drift, runs, explicit=True)
    if runs < RUNS_TO_SETTLE:
        return Tolerance(GROSS_DROP, drift, runs)
    return Tolerance(min(GROSS_DROP, max(floor, SAFETY * largest_drop(run_medians))), drift, runs)


def recorded_level(history: Sequence[float]) -> float:
    """The recorded runs' level: their median once settled, the latest run before that."""
    return statistics.median(history) if len(history) >= RUNS_TO_SETTLE else history[-1]
