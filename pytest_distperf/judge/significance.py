"""The one-sided significance tests behind a comparison: is one set of rates slower (or faster)
than another? Pure functions on lists of positive rates, already checked by the caller.

Mann-Whitney U (exact permutation distribution for small samples, normal approximation with
tie correction past that) by default; a t-test on log rates where too few repeats leave the
rank test no p-value below alpha. scipy is imported lazily (only its special functions, for the
t distribution) so that importing the plugin stays cheap.
"""

from __future__ import annotations

import math
import statistics
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
