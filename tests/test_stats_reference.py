"""scipy.stats gives the results of the hand-written statistics it replaced, on tied and untied
samples: the replaced functions are kept below as the reference (as they were before scipy),
and exact p-values with ties are also checked against a count of every split of the samples.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pytest_distperf.judge import significance, tolerance
from pytest_distperf.judge.stats import compare, compare_to_recorded_runs

ROOT = Path(__file__).resolve().parents[1]

# --- the reference: the hand-written statistics as they were ----------------------------------


def ref_midranks(values: list[float]) -> tuple[list[float], list[int]]:
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


def ref_exact_rank_sum_p(ranks: list[float], n_cur: int, observed: float, slower: bool) -> float:
    import numpy as np

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


def ref_mann_whitney(base: list[float], cur: list[float], slower: bool) -> float:
    pooled = base + cur
    n, n_cur = len(pooled), len(cur)
    ranks, ties = ref_midranks(pooled)
    if len(ties) == 1:
        return 1.0
    rank_sum = sum(ranks[len(base) :])
    if n <= 50:
        return ref_exact_rank_sum_p(ranks, n_cur, rank_sum, slower)
    mean = n_cur * (n + 1) / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = len(base) * n_cur / 12 * ((n + 1) - tie_term)
    z = (rank_sum - mean + 0.5) if slower else (mean - rank_sum + 0.5)
    return 0.5 * math.erfc(-z / math.sqrt(var) / math.sqrt(2))


def ref_t_test_log(base: list[float], cur: list[float], pooled: bool, slower: bool) -> float:
    from scipy.special import stdtr

    lb, lc = [math.log(v) for v in base], [math.log(v) for v in cur]
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
        if diff == 0.0:
            return 1.0
        return 0.0 if (diff < 0) == slower else 1.0
    t = diff / se
    return float(stdtr(df, t if slower else -t))


def ref_relative_spread(values: list[float]) -> float:
    median = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - median) for v in values) / median


def ref_run_drift(runs: list[float]) -> float:
    if len(runs) < 3:
        return 0.0
    if len(runs) < 5:
        return max(ref_relative_spread(runs), statistics.stdev(runs) / statistics.fmean(runs))
    lower, _, upper = statistics.quantiles(runs, n=4, method="inclusive")
    return (upper - lower) / 1.349 / statistics.median(runs)


def ref_quantiles(sorted_values: list[float], n: int) -> list[float]:
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


def enumerated_p(base: list[float], cur: list[float], slower: bool) -> float:
    """Exact conditional p-value by counting every split of the pooled samples."""
    pooled = base + cur
    ranks, _ = ref_midranks(pooled)
    observed = sum(ranks[len(base) :])
    sums = [sum(c) for c in itertools.combinations(ranks, len(cur))]
    hits = sum(s <= observed + 1e-9 if slower else s >= observed - 1e-9 for s in sums)
    return hits / len(sums)


# --- samples -----------------------------------------------------------------------------------


def draw(rng: random.Random, level: float, n: int, step: float | None) -> list[float]:
    values = [level * math.exp(rng.gauss(0, 0.05)) for _ in range(n)]
    return [round(v / step) * step for v in values] if step else values


def sample_pairs(seed: int, count: int, sizes: tuple[int, int], step: float | None):
    rng = random.Random(seed)
    for _ in range(count):
        nb, nc = rng.randint(*sizes), rng.randint(*sizes)
        yield draw(rng, 100.0, nb, step), draw(rng, rng.choice([100.0, 96.0, 90.0]), nc, step)


UNTIED = list(sample_pairs(1, 60, (2, 25), None))
TIED = list(sample_pairs(2, 60, (2, 12), 2.0))  # quantized rates: ties within and across
LARGE = list(sample_pairs(3, 10, (26, 40), None)) + list(sample_pairs(4, 10, (26, 40), 1.0))


def _has_ties(base: list[float], cur: list[float]) -> bool:
    return len(set(base + cur)) < len(base) + len(cur)


@pytest.mark.parametrize("slower", [True, False])
def test_mann_whitney_untied_is_scipys_exact_distribution(slower: bool) -> None:
    pairs = [(b, c) for b, c in UNTIED if not _has_ties(b, c)]
    assert len(pairs) > 50
    for base, cur in pairs:
        ours = significance.one_sided_p(base, cur, "mann-whitney", slower=slower)
        assert ours == pytest.approx(ref_mann_whitney(base, cur, slower), rel=1e-9)


@pytest.mark.parametrize("slower", [True, False])
def test_mann_whitney_with_ties_is_exact(slower: bool) -> None:
    pairs = [(b, c) for b, c in TIED if _has_ties(b, c)]
    assert len(pairs) > 40
    for base, cur in pairs:
        ours = significance.one_sided_p(base, cur, "mann-whitney", slower=slower)
        assert ours == pytest.approx(ref_mann_whitney(base, cur, slower), rel=1e-9)
        if math.comb(len(base) + len(cur), len(cur)) <= 20_000:
            assert ours == pytest.approx(enumerated_p(base, cur, slower), rel=1e-9)


def test_mann_whitney_past_fifty_samples_is_scipys_normal_approximation() -> None:
    assert any(_has_ties(b, c) for b, c in LARGE) and not all(_has_ties(b, c) for b, c in LARGE)
    for base, cur in LARGE:
        for slower in (True, False):
            ours = significance.one_sided_p(base, cur, "mann-whitney", slower=slower)
            assert ours == pytest.approx(ref_mann_whitney(base, cur, slower), rel=1e-9)


@pytest.mark.parametrize("method", ["welch-log", "student-log"])
def test_t_tests_on_log_rates_are_scipys(method: str) -> None:
    pairs = UNTIED + TIED + [([100.0], [90.0, 91.0, 89.5]), ([95.0, 97.0, 96.0], [80.0])]
    checked = 0
    for base, cur in pairs:
        if method == "welch-log" and min(len(base), len(cur)) < 2:
            continue
        for slower in (True, False):
            ours = significance.one_sided_p(base, cur, method, slower=slower)
            reference = ref_t_test_log(base, cur, method == "student-log", slower)
            assert ours == pytest.approx(reference, rel=1e-9, abs=1e-300)
            checked += 1
    assert checked > 200


def test_identical_repeats_and_near_identical_ones_raise_no_warning() -> None:
    # One side all equal: scipy warns of precision loss, which a user's -W error would raise.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        base, cur = [100.0, 105.0, 100.0, 100.0, 105.0], [95.0] * 7
        assert significance.one_sided_p(base, cur, "welch-log", slower=True) == pytest.approx(
            ref_t_test_log(base, cur, False, True), rel=1e-9
        )
        assert significance.one_sided_p([100.0] * 3, [90.0] * 3, "welch-log", slower=True) == 0
        assert significance.one_sided_p([100.0] * 3, [100.0] * 3, "welch-log", slower=True) == 1


def test_spreads_and_quantiles_are_scipys_and_numpys() -> None:
    rng = random.Random(7)
    for _ in range(200):
        values = draw(rng, 100.0, rng.randint(1, 15), rng.choice([None, 1.0]))
        assert tolerance.relative_spread(values) == pytest.approx(
            ref_relative_spread(values), rel=1e-12, abs=1e-15
        )
        runs = draw(rng, 100.0, rng.randint(0, 10), None)
        assert tolerance.run_drift(runs) == pytest.approx(ref_run_drift(runs), rel=1e-12)
        ordered = sorted(values)
        for n in range(1, 12):
            assert tolerance._quantiles(ordered, n) == pytest.approx(
                ref_quantiles(ordered, n), rel=1e-12
            )


# (baseline, current, recorded run medians), and what the hand-written statistics decided:
# (verdict, method, p-value, tolerance, detectable drop), recorded before scipy replaced them.
RECORDED = [
    (
        ([100.0, 101.0, 99.0, 100.5, 99.5], [90.0, 91.0, 89.0, 90.5, 89.5], ()),
        ("regression", "mann-whitney", 0.003968253968253968, 0.05, 0.05),
    ),
    (
        ([100.0, 100.0, 101.0, 101.0, 102.0], [90.0, 90.0, 91.0, 91.0, 90.0], ()),
        ("regression", "mann-whitney", 0.003968253968253968, 0.05, 0.05),
    ),
    (
        ([1000.0, 990.0, 1010.0], [600.0, 610.0, 590.0], ()),
        ("regression", "welch-log", 5.285657839627209e-06, 0.05, 0.05),
    ),
    (
        ([100.0, 80.0, 120.0, 90.0, 110.0], [85.0, 70.0, 115.0, 95.0, 75.0], ()),
        ("ok", "mann-whitney", 0.15476190476190477, 0.44477999999999995, 0.44477999999999995),
    ),
    (
        (
            [100.0, 101.0, 99.0, 100.5, 99.5],
            [88.0, 87.5, 89.0, 88.2, 90.1],
            (100.0, 88.0, 112.0, 95.0, 106.0),
        ),
        ("ok", "mann-whitney", 0.003968253968253968, 0.3346947912230384, 0.3346947912230384),
    ),
    (
        (
            [0.30, 0.36, 0.25, 0.31, 0.29, 0.33, 0.27, 0.30, 0.34, 0.28],
            [0.26, 0.30, 0.22, 0.27, 0.25, 0.28, 0.24, 0.26, 0.29, 0.24],
            (0.33, 0.30, 0.31, 0.30, 0.30),
        ),
        ("regression", "mann-whitney", 0.003355777349585399, 0.10142266400698143, 0.1212121212),
    ),
]


@pytest.mark.parametrize(("samples", "decided"), RECORDED)
def test_decisions_are_the_recorded_ones(
    samples: tuple[list[float], list[float], tuple[float, ...]],
    decided: tuple[str, str, float, float, float],
) -> None:
    base, cur, runs = samples
    result = compare_to_recorded_runs(base, cur, runs) if runs else compare(base, cur)
    verdict, method, p_value, tol, drop = decided
    assert (result.verdict, result.method) == (verdict, method)
    assert result.p_value == pytest.approx(p_value, rel=1e-9)
    assert result.tolerance == pytest.approx(tol, rel=1e-9)
    assert result.detectable_drop == pytest.approx(drop, rel=1e-6)  # bisection to 2^-40


# --- importing stays cheap -------------------------------------------------------------------

CHEAP = [
    "pytest_distperf.plugin",
    "pytest_distperf.judge.stats",
    "pytest_distperf.judge.checks",
    "pytest_distperf.judge.gate",
    "pytest_distperf.output.benchmark_session",
    "pytest_distperf.output.charts",
    "pytest_distperf.cli",
]


@pytest.mark.parametrize("module", CHEAP)
def test_heavy_libraries_are_imported_only_when_used(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert not loaded & {"scipy", "numpy", "matplotlib", "pytest_benchmark", "torch"}
