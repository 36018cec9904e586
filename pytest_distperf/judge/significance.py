"""The one-sided significance tests behind a comparison: is one set of rates slower (or faster)
than another? Pure functions on lists of positive rates, already checked by the caller.

Mann-Whitney U (exact permutation distribution for small samples, normal approximation with
tie correction past that) by default; a t-test on log rates where too few repeats leave the
rank test no p-value below alpha. Both are scipy.stats' own, except the exact distribution
with ties (below). scipy.stats is slow to import, so it is imported inside the functions:
importing the plugin must stay cheap.
"""

from __future__ import annotations

import math
import statistics
import warnings
from typing import Literal

Method = Literal["mann-whitney", "welch-log", "student-log", "none"]

# Exact permutation distribution of the rank sum up to this many pooled samples; past it the
# normal approximation (with tie correction) is accurate and the exact table gets large. At 50 the
# subset counts (C(50, 25) ~ 1.3e14) are still exact integers in float64.
_EXACT_MAX_SAMPLES = 50

METHOD_NAMES = {
    "mann-whitney": "Mann-Whitney U",
    "welch-log": "Welch t-test on log rates",
    "student-log": "pooled t-test on log rates",
    "none": "no test",
}


def mann_whitney_floor(n_baseline: int, n_current: int) -> float:
    """Smallest one-sided p-value the exact Mann-Whitney U test can produce (no ties)."""
    return 1.0 / math.comb(n_baseline + n_current, n_current)


def choose_method(n_baseline: int, n_current: int, alpha: float) -> Method:
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
        # scipy's "exact" ignores ties and its "auto" then switches to the normal approximation,
        # poor at 5 vs 5; its PermutationMethod is exact only by enumerating every split, far
        # too slow for the bisection in detectable_drop past a few repeats. The distribution of
        # the rank sum below is that same exact conditional distribution, counted directly.
        ranks = [float(r) for r in rankdata(pooled)]  # midranks
        return _exact_rank_sum_p(ranks, len(cur), sum(ranks[len(base) :]), slower=slower)
    result = mannwhitneyu(cur, base, alternative="less" if slower else "greater", method=method)
    return float(result.pvalue)


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
    from scipy.stats import ttest_ind, ttest_ind_from_stats

    lb = [math.log(v) for v in base]
    lc = [math.log(v) for v in cur]
    vb = statistics.variance(lb) if len(lb) > 1 else 0.0
    vc = statistics.variance(lc) if len(lc) > 1 else 0.0
    if vb == 0.0 and vc == 0.0:
        # Identical repeats on both sides (mocked or quantized rates): the difference is exact.
        diff = statistics.fmean(lc) - statistics.fmean(lb)
        if diff == 0.0:
            return 1.0
        return 0.0 if (diff < 0) == slower else 1.0
    alternative = "less" if slower else "greater"
    with warnings.catch_warnings():
        # scipy warns of precision loss when repeats nearly agree; its p-value still matches
        # the exact arithmetic of statistics.variance closely (tests/test_stats.py), and a
        # user's `-W error` must not turn a steady machine into a failed gate.
        warnings.simplefilter("ignore", RuntimeWarning)
        if not pooled:
            return float(ttest_ind(lc, lb, equal_var=False, alternative=alternative).pvalue)
        # The pooled form runs when one side has a single sample, whose variance ttest_ind
        # cannot take (NaN); from its summary statistics it adds no spread, only its mean.
        result = ttest_ind_from_stats(
            statistics.fmean(lc),
            math.sqrt(vc),
            len(lc),
            statistics.fmean(lb),
            math.sqrt(vb),
            len(lb),
            equal_var=True,
            alternative=alternative,
        )
    return float(result.pvalue)
