"""How far a timed figure may move before its check says so: one rule on the recorded runs'
medians, which carry both the repeats' noise and the host's drift between sessions. Pure
functions; why each number is what it is: docs/gates.md ("Tolerances").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_distperf.jsonfields import is_number
from pytest_distperf.judge.significance import choose_method, one_sided_p
from pytest_distperf.store.spread import checked_rates

# Recorded runs a baseline needs before its medians measure the host's drift: fewer than
# three have no middle run to measure a drop from.
RUNS_TO_SETTLE = 3
# A settled tolerance is this many times the largest drop any recorded run showed below
# their median: three runs rarely catch the host's worst session.
SAFETY = 3.0
# A drop beyond this fails from the first recorded run, whatever the runs showed: beyond the
# largest drift measured between unchanged sessions on any machine class (docs/gates.md).
GROSS_DROP = 0.5
# Below this drop a provisional baseline's change is the host drift measured between unchanged
# sessions on that machine class, which a single recorded run cannot tell apart (docs/gates.md).
HOST_DRIFT = {"cpu": 0.40, "cuda": 0.20}
# The least settled throughput tolerance of a machine class: three recorded runs may agree by
# chance on a host whose sessions drift (docs/gates.md).
THROUGHPUT_FLOOR = {"cpu": 0.20, "cuda": 0.10}


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
        return 0 if not self.provisional else RUNS_TO_SETTLE - self.runs


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
    """The rule: with RUNS_TO_SETTLE or more recorded runs, max(floor, SAFETY x the largest drop
    of any run below their median), never beyond GROSS_DROP; with fewer, GROSS_DROP. An
    explicit tolerance replaces it from the first run."""
    runs = len(checked_rates(run_medians, "run_medians"))
    drift = HOST_DRIFT.get(accelerator, HOST_DRIFT["cpu"])
    if explicit is not None:
        check_fraction(explicit, "tolerance", upper=math.inf)
        return Tolerance(explicit, drift, runs, explicit=True)
    if runs < RUNS_TO_SETTLE:
        return Tolerance(GROSS_DROP, drift, runs)
    return Tolerance(min(GROSS_DROP, max(floor, SAFETY * largest_drop(run_medians))), drift, runs)


def recorded_level(history: Sequence[float]) -> float:
    """The recorded runs' level: their median once settled, the latest run before that."""
    return statistics.median(history) if len(history) >= RUNS_TO_SETTLE else history[-1]


def detectable_drop(
    baseline: Sequence[float], n_current: int, tolerance: float, alpha: float = 0.01
) -> float:
    """Smallest relative drop that `stats.compare` would flag: beyond `tolerance` and
    significant at `alpha` when the run has the baseline's noise, slowed uniformly (its
    samples the baseline's quantiles times 1 - d); inf when none below 100% is. The p-value
    falls monotonically with d, so bisection finds the significant part."""
    base = checked_rates(baseline, "baseline")
    check_fraction(alpha, "alpha", upper=1.0, allow_zero=False)
    method = choose_method(len(base), n_current, alpha)
    if tolerance >= 1.0 or method == "none":
        return math.inf
    pattern = _quantiles(sorted(base), n_current)

    def significant(drop: float) -> bool:
        shifted = [v * (1.0 - drop) for v in pattern]
        return one_sided_p(base, shifted, method, slower=True) <= alpha

    lo, hi = 0.0, 1.0 - 1e-9
    if not significant(hi):
        return math.inf
    if significant(lo):
        return tolerance
    for _ in range(40):  # 2^-40: far below any meaningful percentage
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if significant(mid) else (mid, hi)
    return max(tolerance, hi)


def _quantiles(sorted_values: list[float], n: int) -> list[float]:
    """n values at the plotting positions (j + 0.5) / n of the sample (Hazen's definition)."""
    if n == len(sorted_values):  # exactly the sample: interpolation would blur ties
        return list(sorted_values)
    import numpy as np  # lazy: only once a comparison runs

    positions = [(j + 0.5) / n for j in range(n)]
    return [float(q) for q in np.quantile(sorted_values, positions, method="hazen")]


def check_fraction(value: float, name: str, *, upper: float, allow_zero: bool = True) -> None:
    if not is_number(value) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not low_ok or value >= upper:
        bound = "[0" if allow_zero else "(0"
        raise ValueError(f"{name} must be in {bound}, {upper:g}), got {value!r}")
