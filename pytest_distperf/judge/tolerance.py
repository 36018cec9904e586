"""How much change the gate tolerates, and the smallest drop it can then catch (pure functions).

The tolerance is max(floor, 3 x the robust spread of the baseline's repeats, the drift of the
medians of the runs recorded for the test times a prediction-interval factor): repeats within a
run share the machine's state, so only whole recorded runs show how far a run may move by
itself. Why each rule is as it is, with the runs that decided it: docs/gates.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_distperf.jsonfields import is_number
from pytest_distperf.judge.significance import choose_method, one_sided_p
from pytest_distperf.store.spread import checked_rates, relative_spread

IQR_TO_SIGMA = 1.349  # the same for the interquartile range (2 x Phi^-1(3/4))

# Default tolerance = max(floor, K * robust relative spread), K = 3 (the Shewhart 3-sigma rule).
# The median of 5 repeats has a standard error of about 1.25 * sigma / sqrt(5), so the difference
# of two such medians has about 0.8 * sigma; 3 sigma is ~3.8 of those, so a run drawn from the
# baseline's own distribution practically never crosses it. The significance test cannot guard
# against run-level offsets (it treats repeats as independent), so the tolerance must; K = 2 would
# leave ~1% of unchanged runs beyond it, and K = 4-5 would hide every regression smaller than
# four or five times a test's noise. The floor covers drift between CI runs that within-run
# repeats never show (a perfectly steady test still moves from one job to the next).
TOLERANCE_SIGMAS = 3.0

# Drift between runs: the medians of the runs recorded for a test (one per baseline refresh),
# once there are this many. Within-run repeats cannot see it, and on some machines it dwarfs
# them (docs/benchmarks/h200-2026-11-29-overlap.md).
MIN_RUNS_FOR_DRIFT = 3
MIN_RUNS_FOR_QUARTILES = 5
# From this many recorded runs the runs' own spread (interquartile, times the prediction factor)
# measures the drift between jobs, and the fixed floor that stood in for it gives way to a small
# one; three runs are too few to trust that far (docs/benchmarks/cpu.md).
RUNS_FOR_SETTLED_FLOOR = MIN_RUNS_FOR_QUARTILES


def recorded_level(history: Sequence[float]) -> float:
    """The recorded runs' level, as the throughput's: their median from MIN_RUNS_FOR_DRIFT on,
    the latest run before that."""
    return statistics.median(history) if len(history) >= MIN_RUNS_FOR_DRIFT else history[-1]


def drift_sigmas(runs: int, alpha: float = 0.01) -> float:
    """How many drift spreads one more run may fall from the recorded runs' level before the
    gate calls it a change: the one-sided (1 - alpha) prediction interval for a new run from
    `runs` recorded ones, Student's t quantile with runs - 1 degrees of freedom times
    sqrt(1 + 1 / runs), and never fewer than TOLERANCE_SIGMAS: 8.0 from 3 runs, 4.1 from 5
    (a spread from three runs is itself a guess: docs/benchmarks/h200-2026-11-30-gate.md).
    An approximation: the level is a median and the spread, from MIN_RUNS_FOR_QUARTILES runs,
    interquartile, with fewer effective degrees of freedom; for 5-9 runs it is slightly small.
    """
    from scipy.special import stdtrit  # lazy: keeps `import pytest_distperf...` cheap

    if runs < 2:
        raise ValueError(f"a spread needs at least 2 runs, got {runs}")
    quantile = float(stdtrit(runs - 1, 1.0 - alpha)) * math.sqrt(1.0 + 1.0 / runs)
    return max(TOLERANCE_SIGMAS, quantile)


def default_tolerance(
    baseline: Sequence[float],
    tolerance_floor: float = 0.05,
    run_medians: Sequence[float] = (),
    alpha: float = 0.01,
) -> float:
    """The tolerance used when none is given: max(floor, 3 x robust relative spread of the
    baseline's repeats, :func:`drift_tolerance`)."""
    check_fraction(tolerance_floor, "tolerance_floor", upper=math.inf)
    return max(
        tolerance_floor,
        TOLERANCE_SIGMAS * relative_spread(baseline),
        drift_tolerance(run_medians, alpha),
    )


def drift_tolerance(run_medians: Sequence[float], alpha: float) -> float:
    """The recorded runs' part of the default tolerance; 0 while there are too few of them."""
    drift = run_drift(run_medians)
    return drift_sigmas(len(run_medians), alpha) * drift if drift else 0.0


def run_drift(run_medians: Sequence[float]) -> float:
    """Relative spread of per-run medians; 0 with fewer than MIN_RUNS_FOR_DRIFT runs. From
    MIN_RUNS_FOR_QUARTILES runs on the interquartile range / 1.349 / median, before that the
    larger of the MAD-based spread and the coefficient of variation.

    Not the MAD alone: a host with two speed levels gives medians such as (100, 100, 160), whose
    MAD is 0. The quartiles see a second level once it holds a quarter of the runs, yet ignore
    one accepted speed-up among ten, which a standard deviation would turn into a ~90% tolerance
    (docs/benchmarks/h200-2026-11-30.md).
    """
    if len(run_medians) < MIN_RUNS_FOR_DRIFT:
        return 0.0
    values = checked_rates(run_medians, "run_medians")
    if len(values) < MIN_RUNS_FOR_QUARTILES:
        return max(relative_spread(values), statistics.stdev(values) / statistics.fmean(values))
    from scipy.stats import iqr  # linear interpolation between order statistics

    return float(iqr(values)) / IQR_TO_SIGMA / statistics.median(values)


def detectable_drop(
    baseline: Sequence[float],
    n_current: int | None = None,
    *,
    tolerance: float | None = None,
    alpha: float = 0.01,
    tolerance_floor: float = 0.05,
    run_medians: Sequence[float] = (),
) -> float:
    """Smallest relative drop that :func:`compare` would flag as a regression.

    Model: the measured run has the baseline's noise, slowed down uniformly by a factor (1 - d);
    its ``n_current`` samples are the baseline's empirical quantiles (the baseline itself when the
    counts match) times (1 - d). The drop condition holds for any d > tolerance; the significance
    condition holds past some d_sig, found by bisection (the p-value falls monotonically with d:
    a uniform slowdown only moves current ranks down, and is a pure shift on the log scale the
    t-tests use). The answer is max(tolerance, d_sig), or inf when no drop below 100% is
    significant (too few samples, or a tolerance of 100% or more). Deterministic: no sampling.
    """
    base = checked_rates(baseline, "baseline")
    n_cur = len(base) if n_current is None else n_current
    if n_cur < 1:
        raise ValueError(f"n_current must be at least 1, got {n_cur}")
    check_fraction(alpha, "alpha", upper=1.0, allow_zero=False)
    runs = checked_rates(run_medians, "run_medians") if run_medians else []
    tol = default_tolerance(base, tolerance_floor, runs, alpha) if tolerance is None else tolerance
    check_fraction(tol, "tolerance", upper=math.inf)
    if tol >= 1.0:
        return math.inf

    method = choose_method(len(base), n_cur, alpha)
    if method == "none":
        return math.inf
    pattern = _quantiles(sorted(base), n_cur)

    def significant(drop: float) -> bool:
        shifted = [v * (1.0 - drop) for v in pattern]
        return one_sided_p(base, shifted, method, slower=True) <= alpha

    lo, hi = 0.0, 1.0 - 1e-9
    if not significant(hi):
        return math.inf
    if significant(lo):
        return tol
    for _ in range(40):  # 2^-40: far below any meaningful percentage
        mid = (lo + hi) / 2
        if significant(mid):
            hi = mid
        else:
            lo = mid
    return max(tol, hi)


def _quantiles(sorted_values: list[float], n: int) -> list[float]:
    """n values at the plotting positions (j + 0.5) / n of the sample, linearly interpolated
    (Hazen's definition)."""
    if n == len(sorted_values):  # exactly the sample: interpolation would blur ties
        return list(sorted_values)
    import numpy as np  # lazy: only once a comparison runs

    positions = [(j + 0.5) / n for j in range(n)]
    return [float(q) for q in np.quantile(sorted_values, positions, method="hazen")]


# --- shared checks of the inputs ------------------------------------------------------------


def check_fraction(value: float, name: str, *, upper: float, allow_zero: bool = True) -> None:
    if not is_number(value) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not low_ok or value >= upper:
        bound = "[0" if allow_zero else "(0"
        raise ValueError(f"{name} must be in {bound}, {upper:g}), got {value!r}")
