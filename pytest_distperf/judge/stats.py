"""A timed figure against its baseline: a change beyond the tolerance counts only where a
one-sided test at ``alpha`` says the repeats moved. Pure; scipy is imported when used."""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_distperf.judge.tolerance import recorded_level
from pytest_distperf.store.entry import checked_numbers

Verdict = Literal["ok", "regression", "improvement", "noisy"]
Method = Literal["mann-whitney", "welch-log", "student-log", "none"]

# Exact permutation distribution of the rank sum up to this many pooled samples; past it the
# tie-corrected normal approximation is accurate (C(50, 25) is still exact in float64).
_EXACT_MAX_SAMPLES = 50

METHOD_NAMES = {
    "mann-whitney": "Mann-Whitney U",
    "welch-log": "Welch t-test on log rates",
    "student-log": "pooled t-test on log rates",
    "none": "no test",
}


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing measured samples with a baseline's (rates: higher is better)."""

    baseline_median: float
    current_median: float
    change: float  # current / baseline - 1: negative when slower
    tolerance: float  # the change allowed either way
    p_value: float  # one-sided, in the direction of the change; NaN where no test can run
    detectable_drop: float  # the smallest drop this comparison flags; inf when none
    verdict: Verdict
    n_baseline: int
    n_current: int
    alpha: float
    method: Method
    unit: str = "tok/s"
    subject: str = "throughput"  # what was compared, for the message's headline
    level_runs: int = 0  # recorded runs whose median set the level (0: the latest run's)

    def message(self) -> str:
        headline = {
            "ok": "within tolerance",
            "regression": "regression",
            "improvement": "improved beyond tolerance; the baseline looks stale, update it",
            "noisy": "changed beyond tolerance without statistical support; rerun with more "
            "repeats",
        }[self.verdict]
        level = f", the median of {self.level_runs} recorded runs" if self.level_runs else ""
        test = (
            f"no test reaches alpha={self.alpha:g} with {self.n_baseline} vs {self.n_current} "
            "samples"
            if self.method == "none"
            else f"p={self.p_value:.3g} ({METHOD_NAMES[self.method]}, one-sided)"
        )
        detect = (
            "no drop is detectable"
            if math.isinf(self.detectable_drop)
            else f"smallest detectable drop {self.detectable_drop:.1%}"
        )
        return (
            f"{self.subject} {headline}: measured median {self.current_median:.5g} {self.unit} "
            f"(n={self.n_current}) vs baseline {self.baseline_median:.5g} {self.unit} "
            f"(n={self.n_baseline}{level}); change {self.change:+.1%} (tolerance "
            f"{self.tolerance:.1%}); {test}; {detect}"
        )


def compare(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    tolerance: float,
    alpha: float = 0.01,
    unit: str = "tok/s",
    subject: str = "throughput",
    level_runs: int = 0,
) -> Comparison:
    """ "regression" or "improvement" beyond ``tolerance`` and significant, "noisy" beyond it
    only, else "ok"; ``baseline`` already at the recorded level."""
    base = _rates(baseline, "baseline")
    cur = _rates(current, "current")
    base_median = statistics.median(base)
    cur_median = statistics.median(cur)
    change = cur_median / base_median - 1.0
    method = choose_method(len(base), len(cur), alpha)
    p_value = one_sided_p(base, cur, method, slower=change <= 0)
    verdict: Verdict = "ok"
    if abs(change) > tolerance:
        significant = not math.isnan(p_value) and p_value <= alpha
        verdict = "noisy" if not significant else "regression" if change < 0 else "improvement"
    return Comparison(
        baseline_median=base_median,
        current_median=cur_median,
        change=change,
        tolerance=tolerance,
        p_value=p_value,
        detectable_drop=detectable_drop(base, len(cur), tolerance, alpha),
        verdict=verdict,
        n_baseline=len(base),
        n_current=len(cur),
        alpha=alpha,
        method=method,
        unit=unit,
        subject=subject,
        level_runs=level_runs,
    )


def _rates(samples: Sequence[float], name: str) -> list[float]:
    rates = checked_numbers(samples, "compare", name)
    if not rates:
        raise ValueError(f"compare: no {name} samples")
    return list(rates)


def at_level(samples: Sequence[float], run_medians: Sequence[float]) -> list[float]:
    """The latest recorded repeats rescaled to the recorded runs' level (recorded_level)."""
    base = _rates(samples, "baseline")
    scale = recorded_level(run_medians) / statistics.median(base) if run_medians else 1.0
    return [v * scale for v in base]


def detectable_drop(
    baseline: Sequence[float], n_current: int, tolerance: float, alpha: float = 0.01
) -> float:
    """Smallest relative drop `compare` would flag in a run with the baseline's noise slowed
    uniformly (its quantiles times 1 - d); inf when none below 100% is. The p-value falls
    monotonically with d, so bisection finds it."""
    base = _rates(baseline, "baseline")
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
    import numpy as np

    positions = [(j + 0.5) / n for j in range(n)]
    return [float(q) for q in np.quantile(sorted_values, positions, method="hazen")]


def choose_method(n_baseline: int, n_current: int, alpha: float) -> Method:
    # Mann-Whitney U needs no distributional assumption (stalls skew throughput), but its exact
    # p cannot fall below 1 / C(n1 + n2, n1); where that is above alpha, a t-test on log rates
    # (a slowdown is multiplicative), pooled when one side has a single sample.
    if 1.0 / math.comb(n_baseline + n_current, n_current) <= alpha:
        return "mann-whitney"
    if n_baseline >= 2 and n_current >= 2:
        return "welch-log"
    if n_baseline + n_current >= 3:
        return "student-log"
    return "none"


def one_sided_p(base: list[float], cur: list[float], method: Method, *, slower: bool) -> float:
    if method == "mann-whitney":
        return _mann_whitney(base, cur, slower=slower)
    if method in ("welch-log", "student-log"):
        return _t_test_log(base, cur, pooled=method == "student-log", slower=slower)
    return math.nan


def _mann_whitney(base: list[float], cur: list[float], *, slower: bool) -> float:
    from scipy.stats import mannwhitneyu, rankdata

    pooled = base + cur
    distinct = len(set(pooled))
    if distinct == 1:
        return 1.0  # every value equal: no evidence either way
    if len(pooled) > _EXACT_MAX_SAMPLES:
        method = "asymptotic"  # tie-corrected, with continuity correction
    elif distinct == len(pooled):
        method = "exact"
    else:
        # scipy's "exact" ignores ties and its PermutationMethod is far too slow for the
        # bisection in detectable_drop: the exact conditional distribution, counted directly.
        ranks = [float(r) for r in rankdata(pooled)]  # midranks
        return _exact_rank_sum_p(ranks, len(cur), sum(ranks[len(base) :]), slower=slower)
    result = mannwhitneyu(cur, base, alternative="less" if slower else "greater", method=method)
    return float(result.pvalue)


def _exact_rank_sum_p(ranks: list[float], n_cur: int, observed: float, *, slower: bool) -> float:
    import numpy as np

    # Doubled midranks are integers: the rank sum's distribution over all C(N, n_cur) subsets
    # is a table indexed by (subset size, doubled sum).
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
    from scipy.stats import ttest_ind_from_stats

    lb = [math.log(v) for v in base]
    lc = [math.log(v) for v in cur]
    vb = statistics.variance(lb) if len(lb) > 1 else 0.0
    vc = statistics.variance(lc) if len(lc) > 1 else 0.0
    diff = statistics.fmean(lc) - statistics.fmean(lb)
    if vb == 0.0 and vc == 0.0:  # identical repeats on both sides: the difference is exact
        return 1.0 if diff == 0.0 else 0.0 if (diff < 0) == slower else 1.0
    with warnings.catch_warnings():
        # scipy warns of precision loss when repeats nearly agree; a user's `-W error` must not
        # turn a steady machine into a failed gate.
        warnings.simplefilter("ignore", RuntimeWarning)
        result = ttest_ind_from_stats(
            statistics.fmean(lc),
            math.sqrt(vc),
            len(lc),
            statistics.fmean(lb),
            math.sqrt(vb),
            len(lb),
            equal_var=pooled,
            alternative="less" if slower else "greater",
        )
    return float(result.pvalue)
