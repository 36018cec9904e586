"""Noise-aware regression decisions on repeated throughput samples (pure functions, no I/O).

A measured run is called a regression only when BOTH hold:

1. its median is below the baseline median by more than a *tolerance* (practical significance:
   run-to-run drift, clocks, and neighbours move whole runs, which within-run repeats cannot see),
2. a one-sided test says the samples are slower than the baseline's at level ``alpha``
   (statistical significance: a few unlucky repeats must not fail CI).

The tolerance alone would turn every noisy median into a red job; the test alone would call a
0.5% run-to-run offset "highly significant" with tight repeats. Requiring both keeps the false-alarm
rate below ``alpha`` and ignores changes nobody would act on.

scipy is imported lazily (only its special functions, for the t distribution) so that importing
the plugin stays cheap.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["ok", "regression", "improvement", "noisy"]
Method = Literal["mann-whitney", "welch-log", "student-log", "none"]

# 1.4826 * MAD estimates the standard deviation for normal data (1 / Phi^-1(3/4)), so the spread
# below is on the same scale as a coefficient of variation, yet one wild repeat cannot inflate it.
_MAD_TO_SIGMA = 1.4826
_IQR_TO_SIGMA = 1.349  # the same for the interquartile range (2 x Phi^-1(3/4))

# Default tolerance = max(floor, K * robust relative spread), K = 3 (the Shewhart 3-sigma rule).
# The median of 5 repeats has a standard error of about 1.25 * sigma / sqrt(5), so the difference
# of two such medians has about 0.8 * sigma; 3 sigma is ~3.8 of those, so a run drawn from the
# baseline's own distribution practically never crosses it. The significance test cannot guard
# against run-level offsets (it treats repeats as independent), so the tolerance must; K = 2 would
# leave ~1% of unchanged runs beyond it, and K = 4-5 would hide real 15-20% regressions on tests
# with ordinary 3-5% noise. The floor covers drift between CI runs that within-run repeats never
# show (a perfectly steady test still moves a few percent from one job to the next).
TOLERANCE_SIGMAS = 3.0

# Drift between runs, measured: the medians of the runs recorded for a test (one per baseline
# refresh), once there are this many. Within-run repeats cannot see it, and on some machines it
# dwarfs them: unchanged reruns of the example suite on a 2 x H200 VM moved by 11-17% (CV of
# the run medians) while each run's repeats agreed within a few percent.
MIN_RUNS_FOR_DRIFT = 3
MIN_RUNS_FOR_QUARTILES = 5


def drift_sigmas(runs: int, alpha: float = 0.01) -> float:
    """How many drift spreads one more run may fall from the recorded runs' level before the
    gate calls it a change: the one-sided (1 - alpha) prediction interval for a new run from
    `runs` recorded ones, Student's t quantile with runs - 1 degrees of freedom times
    sqrt(1 + 1 / runs), and never fewer than TOLERANCE_SIGMAS.

    A spread estimated from three runs is itself a guess: 3 of them would leave about 6% of
    unchanged runs outside (t with 2 degrees of freedom), per test, and on a 2 x H200 VM whose
    host changes speed 1 of 10 unchanged runs of five tests failed with three records. The
    factor is 8.0 from 3 runs, 4.1 from 5, 3.4 from 7, and TOLERANCE_SIGMAS from 10 on: the
    report's detectable drop says what the gate is worth until enough runs are recorded.

    An approximation: the interval is for a mean and a standard deviation, while the level is
    a median and, from MIN_RUNS_FOR_QUARTILES runs, the spread interquartile, which carries
    fewer effective degrees of freedom; for 5-9 runs the factor is slightly too small.
    """
    from scipy.special import stdtrit  # lazy: keeps `import pytest_distperf...` cheap

    if runs < 2:
        raise ValueError(f"a spread needs at least 2 runs, got {runs}")
    quantile = float(stdtrit(runs - 1, 1.0 - alpha)) * math.sqrt(1.0 + 1.0 / runs)
    return max(TOLERANCE_SIGMAS, quantile)


# Exact permutation distribution of the rank sum up to this many pooled samples; past it the
# normal approximation (with tie correction) is accurate and the exact table gets large. At 50 the
# subset counts (C(50, 25) ~ 1.3e14) are still exact integers in float64.
_EXACT_MAX_SAMPLES = 50

_METHOD_NAMES = {
    "mann-whitney": "Mann-Whitney U",
    "welch-log": "Welch t-test on log rates",
    "student-log": "pooled t-test on log rates",
    "none": "no test",
}


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing measured throughput samples with a baseline's."""

    baseline_median: float
    current_median: float
    #: Relative change of the medians: current / baseline - 1 (negative = slower).
    change: float
    #: Relative change of the median that is tolerated in either direction.
    tolerance: float
    #: One-sided p-value in the direction of the observed change (slower if change <= 0,
    #: faster otherwise); NaN when no test can be run on these sample counts.
    p_value: float
    #: Smallest relative drop that this comparison would flag as a regression (both conditions),
    #: assuming the run has the baseline's noise; inf when none can be flagged.
    detectable_drop: float
    verdict: Verdict
    n_baseline: int
    n_current: int
    alpha: float
    method: Method
    unit: str = "tok/s"
    #: What was compared, for the message's headline.
    subject: str = "throughput"
    #: Number of recorded runs whose spread set the tolerance (0: it came from the repeats).
    tolerance_runs: int = 0
    #: Number of recorded runs whose median set the baseline's level (0: the latest run's).
    level_runs: int = 0

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_value) and self.p_value <= self.alpha

    def message(self) -> str:
        headline = (
            self.subject
            + {
                "ok": " within tolerance",
                "regression": " regression",
                "improvement": " improved beyond tolerance; the baseline looks stale, update it",
                "noisy": " changed beyond tolerance but without statistical support; "
                "rerun with more repeats",
            }[self.verdict]
        )
        parts = [
            f"{headline}: measured median {self.current_median:.5g} {self.unit} "
            f"(n={self.n_current}) vs baseline median {self.baseline_median:.5g} {self.unit} "
            f"(n={self.n_baseline}"
            + (f", the median of {self.level_runs} recorded runs" if self.level_runs else "")
            + f"); change {self.change:+.1%} (tolerance {self.tolerance:.1%}"
            + (
                f", from the spread of {self.tolerance_runs} recorded runs"
                if self.tolerance_runs
                else ""
            )
            + ")",
        ]
        if self.method == "none":
            parts.append(
                f"no test can reach alpha={self.alpha:g} with {self.n_baseline} vs "
                f"{self.n_current} samples; record more repeats"
            )
        else:
            side = "slower" if self.change <= 0 else "faster"
            parts.append(
                f"p={self.p_value:.3g} ({_METHOD_NAMES[self.method]}, one-sided {side}, "
                f"alpha={self.alpha:g})"
            )
            floor = mann_whitney_floor(self.n_baseline, self.n_current)
            if self.method != "mann-whitney":
                parts.append(
                    f"too few repeats for Mann-Whitney U: its smallest p with "
                    f"{self.n_baseline} vs {self.n_current} samples is {floor:.3g} > alpha, so "
                    f"the test assumes log-normal rates"
                )
        if math.isinf(self.detectable_drop):
            parts.append("no drop is detectable with this baseline noise and these repeats")
        else:
            parts.append(f"smallest detectable drop {self.detectable_drop:.1%}")
        return "; ".join(parts)


def relative_spread(samples: Sequence[float]) -> float:
    """Robust relative spread: 1.4826 * MAD / median (a CV that ignores a single outlier)."""
    values = _checked(samples, "samples")
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return _MAD_TO_SIGMA * mad / median


def default_tolerance(
    baseline: Sequence[float],
    tolerance_floor: float = 0.05,
    run_medians: Sequence[float] = (),
    alpha: float = 0.01,
) -> float:
    """The tolerance used when none is given: max(floor, 3 x robust relative spread of the
    baseline's repeats, the drift of the recorded runs' medians when there are enough of them
    (:func:`run_drift`) times :func:`drift_sigmas`)."""
    _check_fraction(tolerance_floor, "tolerance_floor", upper=math.inf)
    return max(
        tolerance_floor,
        TOLERANCE_SIGMAS * relative_spread(baseline),
        _drift_tolerance(run_medians, alpha),
    )


def _drift_tolerance(run_medians: Sequence[float], alpha: float) -> float:
    drift = run_drift(run_medians)
    return drift_sigmas(len(run_medians), alpha) * drift if drift else 0.0


def run_drift(run_medians: Sequence[float]) -> float:
    """Relative spread of per-run medians; 0 with fewer than MIN_RUNS_FOR_DRIFT runs.

    From MIN_RUNS_FOR_QUARTILES runs on: interquartile range / 1.349 (a standard deviation for
    normal data) / median. Before that: the larger of the MAD-based spread and the coefficient
    of variation.

    Not the MAD: a host with two speed levels gives run medians such as (100, 100, 160), or six
    at one level and four at the other, whose MAD is 0; on a 2 x H200 VM three recorded runs
    then let 4 of 8 unchanged runs fail. The quartiles see a second level once it holds a
    quarter of the runs, yet ignore one run at a new level among ten (an accepted speed-up,
    say), which a standard deviation would turn into a tolerance of ~90% for ten refreshes.
    Three or four runs have no quartiles worth the name; on that VM, replaying two gate calls
    with three recorded runs, 2 of 13 unchanged runs failed with this rule and 4 with the
    quartiles.
    """
    if len(run_medians) < MIN_RUNS_FOR_DRIFT:
        return 0.0
    values = _checked(run_medians, "run_medians")
    if len(values) < MIN_RUNS_FOR_QUARTILES:
        return max(relative_spread(values), statistics.stdev(values) / statistics.fmean(values))
    lower, _, upper = statistics.quantiles(values, n=4, method="inclusive")
    return (upper - lower) / _IQR_TO_SIGMA / statistics.median(values)


def mann_whitney_floor(n_baseline: int, n_current: int) -> float:
    """Smallest one-sided p-value the exact Mann-Whitney U test can produce (no ties)."""
    return 1.0 / math.comb(n_baseline + n_current, n_current)


def compare(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    tolerance: float | None = None,
    alpha: float = 0.01,
    tolerance_floor: float = 0.05,
    unit: str = "tok/s",
    run_medians: Sequence[float] = (),
    subject: str = "throughput",
) -> Comparison:
    """Decide whether ``current`` throughput samples regressed against ``baseline`` samples.

    ``tolerance`` is relative (0.1 = 10%); None derives it from the baseline's noise and from
    ``run_medians`` (the medians of the runs recorded for this test) with
    :func:`default_tolerance`. Verdicts: "regression" (slower beyond tolerance and significant),
    "improvement" (faster beyond tolerance and significant: the baseline is stale), "noisy"
    (beyond tolerance either way but not significant, or untestable), "ok" otherwise.
    """
    base = _checked(baseline, "baseline")
    cur = _checked(current, "current")
    runs = _checked(run_medians, "run_medians") if run_medians else []
    _check_fraction(alpha, "alpha", upper=1.0, allow_zero=False)
    tol = default_tolerance(base, tolerance_floor, runs, alpha) if tolerance is None else tolerance
    _check_fraction(tol, "tolerance", upper=math.inf)
    drift = _drift_tolerance(runs, alpha)
    tolerance_runs = len(runs) if tolerance is None and drift > 0 and drift == tol else 0

    base_median = statistics.median(base)
    cur_median = statistics.median(cur)
    change = cur_median / base_median - 1.0
    method = _choose_method(len(base), len(cur), alpha)
    p_value = _p_value(base, cur, method, slower=change <= 0)
    significant = not math.isnan(p_value) and p_value <= alpha

    verdict: Verdict
    if abs(change) <= tol:
        verdict = "ok"
    elif not significant:
        verdict = "noisy"
    else:
        verdict = "regression" if change < 0 else "improvement"

    return Comparison(
        baseline_median=base_median,
        current_median=cur_median,
        change=change,
        tolerance=tol,
        p_value=p_value,
        detectable_drop=detectable_drop(base, len(cur), tolerance=tol, alpha=alpha),
        verdict=verdict,
        n_baseline=len(base),
        n_current=len(cur),
        alpha=alpha,
        method=method,
        unit=unit,
        subject=subject,
        tolerance_runs=tolerance_runs,
    )


def compare_to_recorded_runs(
    baseline: Sequence[float],
    current: Sequence[float],
    run_medians: Sequence[float],
    *,
    tolerance: float | None = None,
    alpha: float = 0.01,
    tolerance_floor: float = 0.05,
    unit: str = "tok/s",
    subject: str = "throughput",
) -> Comparison:
    """:func:`compare` for a quantity whose whole runs agree better than their repeats do.

    The relative speed (results.RunResult) is one: a repeat straddling a switch of the host's
    speed pairs a wrapped run at one speed with a bare run at the other, so its repeats spread
    widely (robust CV 0.6-30% on a 2 x H200 VM) while the medians of 11 unchanged runs spread
    by 2.1-4.3% (CV; their tokens/sec by 12-21%). So from MIN_RUNS_FOR_DRIFT recorded runs on,
    their median is the baseline's level (the latest run's repeats, rescaled to it, keep their
    shape for the significance test) and the default tolerance is max(floor, their
    :func:`run_drift` times :func:`drift_sigmas`); the repeats' own spread no longer enters, as
    the runs' medians already carry it. With fewer runs this is :func:`compare`.
    """
    runs = _checked(run_medians, "run_medians") if run_medians else []
    if len(runs) < MIN_RUNS_FOR_DRIFT:
        return compare(
            baseline,
            current,
            tolerance=tolerance,
            alpha=alpha,
            tolerance_floor=tolerance_floor,
            unit=unit,
            run_medians=runs,
            subject=subject,
        )
    _check_fraction(tolerance_floor, "tolerance_floor", upper=math.inf)
    base = _checked(baseline, "baseline")
    scale = statistics.median(runs) / statistics.median(base)
    derived = max(tolerance_floor, _drift_tolerance(runs, alpha))
    comparison = compare(
        [v * scale for v in base],
        current,
        tolerance=derived if tolerance is None else tolerance,
        alpha=alpha,
        unit=unit,
        subject=subject,
    )
    from_runs = len(runs) if tolerance is None and derived > tolerance_floor else 0
    return dataclasses.replace(comparison, tolerance_runs=from_runs, level_runs=len(runs))


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
    base = _checked(baseline, "baseline")
    n_cur = len(base) if n_current is None else n_current
    if n_cur < 1:
        raise ValueError(f"n_current must be at least 1, got {n_cur}")
    _check_fraction(alpha, "alpha", upper=1.0, allow_zero=False)
    runs = _checked(run_medians, "run_medians") if run_medians else []
    tol = default_tolerance(base, tolerance_floor, runs, alpha) if tolerance is None else tolerance
    _check_fraction(tol, "tolerance", upper=math.inf)
    if tol >= 1.0:
        return math.inf

    method = _choose_method(len(base), n_cur, alpha)
    if method == "none":
        return math.inf
    pattern = _quantiles(sorted(base), n_cur)

    def significant(drop: float) -> bool:
        shifted = [v * (1.0 - drop) for v in pattern]
        return _p_value(base, shifted, method, slower=True) <= alpha

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


def compare_memory(
    baseline_bytes: int | None, current_bytes: int | None, tolerance: float = 0.10
) -> str | None:
    """Failure message when peak memory grew by more than ``tolerance`` (relative), else None.

    None on either side means "not measured" (e.g. a CPU run without an allocator hook), which is
    not a failure: there is nothing to compare.
    """
    _check_fraction(tolerance, "tolerance", upper=math.inf)
    if baseline_bytes is None or current_bytes is None:
        return None
    for name, value in (("baseline_bytes", baseline_bytes), ("current_bytes", current_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if baseline_bytes == 0:
        growth = math.inf if current_bytes > 0 else 0.0
    else:
        growth = current_bytes / baseline_bytes - 1.0
    if growth <= tolerance:
        return None
    growth_text = "from nothing" if math.isinf(growth) else f"by {growth:.1%}"
    return (
        f"peak memory grew {growth_text} (tolerance {tolerance:.1%}): measured "
        f"{format_bytes(current_bytes)} vs baseline {format_bytes(baseline_bytes)}"
    )


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{value:.3g} TiB"


# --- internals -------------------------------------------------------------------------------


def _checked(samples: Sequence[float], name: str) -> list[float]:
    values = list(samples)
    if not values:
        raise ValueError(f"{name}: no samples")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{name}: samples must be numbers, got {v!r}")
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name}: rates must be finite and positive, got {v!r}")
    return [float(v) for v in values]


def _check_fraction(value: float, name: str, *, upper: float, allow_zero: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not low_ok or value >= upper:
        bound = "[0" if allow_zero else "(0"
        raise ValueError(f"{name} must be in {bound}, {upper:g}), got {value!r}")


def _choose_method(n_baseline: int, n_current: int, alpha: float) -> Method:
    # Mann-Whitney U is the default: throughput noise is skewed (stalls make slow outliers) and
    # rank tests need no distributional assumption. But its exact one-sided p cannot fall below
    # 1 / C(n1 + n2, n1): 1/252 for 5 vs 5, 1/70 for 4 vs 4, 1/20 for 3 vs 3. When that floor is
    # above alpha the rank test could never flag anything, so fall back to a t-test on log rates
    # (a slowdown is multiplicative; log makes it a shift) and say so in the message: it assumes
    # log-normal noise, which few repeats cannot check. With a single sample on one side Welch has
    # no variance to use, so the pooled (equal-variance) form borrows it from the other side; with
    # one sample on each side nothing can be tested.
    if mann_whitney_floor(n_baseline, n_current) <= alpha:
        return "mann-whitney"
    if n_baseline >= 2 and n_current >= 2:
        return "welch-log"
    if n_baseline + n_current >= 3:
        return "student-log"
    return "none"


def _p_value(base: list[float], cur: list[float], method: Method, *, slower: bool) -> float:
    if method == "mann-whitney":
        return _mann_whitney(base, cur, slower=slower)
    if method in ("welch-log", "student-log"):
        return _t_test_log(base, cur, pooled=method == "student-log", slower=slower)
    return math.nan


def _midranks(values: list[float]) -> tuple[list[float], list[int]]:
    """Ranks 1..N with ties sharing their average rank, and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _mann_whitney(base: list[float], cur: list[float], *, slower: bool) -> float:
    # Own implementation rather than scipy.stats.mannwhitneyu: scipy's "auto" switches to the
    # normal approximation as soon as there is a tie, which is poor at 5 vs 5, and its choice of
    # method has changed between releases. Here small samples always get the exact conditional
    # permutation distribution of the rank sum (ties included), so a verdict does not depend on
    # the scipy on the runner.
    pooled = base + cur
    n, n_cur = len(pooled), len(cur)
    ranks, ties = _midranks(pooled)
    if len(ties) == 1:
        return 1.0  # every value equal: no evidence either way
    rank_sum = sum(ranks[len(base) :])
    if n <= _EXACT_MAX_SAMPLES:
        return _exact_rank_sum_p(ranks, n_cur, rank_sum, slower=slower)
    n_base = len(base)
    mean = n_cur * (n + 1) / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = n_base * n_cur / 12 * ((n + 1) - tie_term)
    # Continuity correction: half a rank-sum step towards the mean before the normal CDF.
    if slower:
        return _normal_cdf((rank_sum - mean + 0.5) / math.sqrt(var))
    return _normal_cdf((mean - rank_sum + 0.5) / math.sqrt(var))


def _exact_rank_sum_p(ranks: list[float], n_cur: int, observed: float, *, slower: bool) -> float:
    import numpy as np  # lazy: numpy is only needed once a comparison runs

    # Doubled midranks are integers, so the distribution of the current group's rank sum over all
    # C(N, n_cur) equally likely subsets is a table indexed by (subset size, doubled sum).
    doubled = [round(2 * r) for r in ranks]
    total = sum(sorted(doubled)[-n_cur:])
    ways = np.zeros((n_cur + 1, total + 1))
    ways[0, 0] = 1.0
    for r in doubled:
        ways[1:, r:] += ways[:-1, : total + 1 - r].copy()
    dist = ways[n_cur]
    obs = round(2 * observed)
    tail = dist[: obs + 1].sum() if slower else dist[obs:].sum()
    return float(min(1.0, tail / dist.sum()))


def _t_test_log(base: list[float], cur: list[float], *, pooled: bool, slower: bool) -> float:
    from scipy.special import stdtr  # lazy: keeps `import pytest_distperf...` cheap

    lb = [math.log(v) for v in base]
    lc = [math.log(v) for v in cur]
    nb, nc = len(lb), len(lc)
    diff = statistics.fmean(lc) - statistics.fmean(lb)
    vb = statistics.variance(lb) if nb > 1 else 0.0
    vc = statistics.variance(lc) if nc > 1 else 0.0
    if pooled:
        df = nb + nc - 2
        se = math.sqrt(((nb - 1) * vb + (nc - 1) * vc) / df * (1 / nb + 1 / nc))
    else:
        a, b = vb / nb, vc / nc
        se = math.sqrt(a + b)
        denom = a * a / (nb - 1) + b * b / (nc - 1)
        df = (a + b) ** 2 / denom if denom > 0 else nb + nc - 2
    if se == 0.0:
        # Identical repeats on both sides (mocked or quantized rates): the difference is exact.
        if diff == 0.0:
            return 1.0
        return 0.0 if (diff < 0) == slower else 1.0
    t = diff / se
    return float(stdtr(df, t if slower else -t))


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def _quantiles(sorted_values: list[float], n: int) -> list[float]:
    """n values at the plotting positions (j + 0.5) / n of the sample, linearly interpolated."""
    m = len(sorted_values)
    if n == m:
        return list(sorted_values)
    out = []
    for j in range(n):
        pos = min(max((j + 0.5) / n * m - 0.5, 0.0), m - 1.0)
        lo = math.floor(pos)
        hi = min(lo + 1, m - 1)
        frac = pos - lo
        out.append(sorted_values[lo] * (1 - frac) + sorted_values[hi] * frac)
    return out
