"""The statistics behind the gate checked against independent answers: a count of every split
of the pooled samples (exact rank-sum p-values, tied or not), textbook formulas (the normal
approximation, t-tests from Student's t distribution, spreads from `statistics`), cases worked
out by hand, and the decisions the hand-written statistics took before scipy replaced them.
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

from pytest_distperf.judge import stats, tolerance
from pytest_distperf.judge.stats import compare
from pytest_distperf.store.entry import relative_spread

ROOT = Path(__file__).resolve().parents[1]

# --- independent answers ---------------------------------------------------------------------


def midranks(values: list[float]) -> list[float]:
    """Rank of each value, ties sharing the mean of the ranks they span."""
    ordered = sorted(values)
    first = {v: ordered.index(v) + 1 for v in values}
    count = {v: ordered.count(v) for v in values}
    return [first[v] + (count[v] - 1) / 2 for v in values]


def enumerated_p(base: list[float], cur: list[float], slower: bool) -> float:
    """Exact conditional p-value of the rank sum, counting every split of the pooled samples."""
    ranks = midranks(base + cur)
    observed = sum(ranks[len(base) :])
    sums = [sum(c) for c in itertools.combinations(ranks, len(cur))]
    hits = sum(s <= observed + 1e-9 if slower else s >= observed - 1e-9 for s in sums)
    return hits / len(sums)


def normal_approximation_p(base: list[float], cur: list[float], slower: bool) -> float:
    """The textbook large-sample rank-sum test: tie-corrected variance, continuity correction."""
    pooled = base + cur
    n, n_cur = len(pooled), len(cur)
    ranks = midranks(pooled)
    ties = [pooled.count(v) for v in set(pooled)]
    rank_sum = sum(ranks[len(base) :])
    mean = n_cur * (n + 1) / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = len(base) * n_cur / 12 * ((n + 1) - tie_term)
    z = (rank_sum - mean + 0.5) if slower else (mean - rank_sum + 0.5)
    return 0.5 * math.erfc(-z / math.sqrt(var) / math.sqrt(2))


def t_test_log_p(base: list[float], cur: list[float], pooled: bool, slower: bool) -> float:
    """Welch's or Student's t on log rates, from the formulas and Student's t distribution."""
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
        df = (a + b) ** 2 / (a * a / (nb - 1) + b * b / (nc - 1))
    t = diff / se
    return float(stdtr(df, t if slower else -t))


# --- samples -----------------------------------------------------------------------------------


def draw(rng: random.Random, level: float, n: int, step: float | None) -> list[float]:
    values = [level * math.exp(rng.gauss(0, 0.05)) for _ in range(n)]
    return [round(v / step) * step for v in values] if step else values


def sample_pairs(seed: int, count: int, sizes: tuple[int, int], step: float | None):
    rng = random.Random(seed)
    for _ in range(count):
        nb, nc = rng.randint(*sizes), rng.randint(*sizes)
        yield draw(rng, 100.0, nb, step), draw(rng, rng.choice([100.0, 96.0, 90.0]), nc, step)


# Small enough to count every split (at most C(14, 7) = 3432 of them).
UNTIED = list(sample_pairs(1, 60, (2, 7), None))
TIED = list(sample_pairs(2, 60, (2, 7), 2.0))  # quantized rates: ties within and across
LARGE = list(sample_pairs(3, 10, (26, 40), None)) + list(sample_pairs(4, 10, (26, 40), 1.0))
WIDE = list(sample_pairs(5, 40, (2, 25), None)) + list(sample_pairs(6, 40, (2, 12), 2.0))


def _has_ties(base: list[float], cur: list[float]) -> bool:
    return len(set(base + cur)) < len(base) + len(cur)


@pytest.mark.parametrize("slower", [True, False])
def test_mann_whitney_is_the_count_of_every_split(slower: bool) -> None:
    untied = [(b, c) for b, c in UNTIED if not _has_ties(b, c)]
    tied = [(b, c) for b, c in TIED if _has_ties(b, c)]
    assert len(untied) > 50 and len(tied) > 40
    for base, cur in untied + tied:
        ours = stats.one_sided_p(base, cur, "mann-whitney", slower=slower)
        assert ours == pytest.approx(enumerated_p(base, cur, slower), rel=1e-9)


def test_mann_whitney_by_hand() -> None:
    def p(base: list[float], cur: list[float], slower: bool = True) -> float:
        return stats.one_sided_p(base, cur, "mann-whitney", slower=slower)

    # cur below every baseline value: one split in C(n, k) is as extreme
    assert p([10.0, 11, 12, 13, 14], [1.0, 2, 3, 4, 5]) == pytest.approx(1 / 252)
    assert p([float(v) for v in range(30, 55)], [float(v) for v in range(25)]) == pytest.approx(
        1 / math.comb(50, 25)
    )
    assert p([1.0, 2, 3], [0.5]) == pytest.approx(1 / 4)
    # pooled 1 2 2 2 3, midranks 1 3 3 3 5; cur {1, 2} sums 4; pairs' sums: 4 x3, 6 x4, 8 x3
    assert p([2.0, 2, 3], [1.0, 2]) == pytest.approx(3 / 10)
    # pooled 1 2 2 2, midranks 1 3 3 3; cur {2, 2} sums 6, as 3 of the 6 pairs do, none more
    assert p([1.0, 2], [2.0, 2], slower=False) == pytest.approx(1 / 2)
    assert p([1.0, 2], [2.0, 2], slower=True) == 1.0
    assert p([5.0, 5], [5.0, 5, 5]) == 1.0  # every value equal: no evidence


def test_mann_whitney_past_fifty_samples_is_the_normal_approximation() -> None:
    assert any(_has_ties(b, c) for b, c in LARGE) and not all(_has_ties(b, c) for b, c in LARGE)
    for base, cur in LARGE:
        for slower in (True, False):
            ours = stats.one_sided_p(base, cur, "mann-whitney", slower=slower)
            assert ours == pytest.approx(normal_approximation_p(base, cur, slower), rel=1e-9)


def test_mann_whitney_agrees_with_scipys_permutation_test() -> None:
    """Past what the count above covers, against scipy's own exact permutation test (few
    cases: it enumerates every split too)."""
    import numpy as np
    from scipy.stats import PermutationMethod, mannwhitneyu

    exact = PermutationMethod(n_resamples=np.inf)
    beyond = [(b, c) for b, c in WIDE if 3432 < math.comb(len(b) + len(c), len(c)) <= 20_000]
    cases = [p for p in beyond if _has_ties(*p)][:2] + [p for p in beyond if not _has_ties(*p)][:2]
    assert len(cases) == 4
    for base, cur in cases:
        ours = stats.one_sided_p(base, cur, "mann-whitney", slower=True)
        theirs = mannwhitneyu(cur, base, alternative="less", method=exact).pvalue
        assert ours == pytest.approx(float(theirs), rel=1e-9)


@pytest.mark.parametrize("method", ["welch-log", "student-log"])
def test_t_tests_on_log_rates_are_the_formulas(method: str) -> None:
    pairs = UNTIED + TIED + WIDE + [([100.0], [90.0, 91.0, 89.5]), ([95.0, 97.0, 96.0], [80.0])]
    checked = 0
    for base, cur in pairs:
        if method == "welch-log" and min(len(base), len(cur)) < 2:
            continue
        if statistics.pvariance(base) == 0 and statistics.pvariance(cur) == 0:
            continue  # the exact-difference case: by hand below
        for slower in (True, False):
            ours = stats.one_sided_p(base, cur, method, slower=slower)
            reference = t_test_log_p(base, cur, method == "student-log", slower)
            assert ours == pytest.approx(reference, rel=1e-9, abs=1e-300)
            checked += 1
    assert checked > 200


def test_t_tests_by_hand() -> None:
    e = math.exp
    # logs 0, 0.2 against -0.3, -0.1: diff -0.3, se sqrt(0.02), t = -3 / sqrt(2), 2 d.f.,
    # whose CDF is 1/2 + t / (2 sqrt(2 + t^2))
    welch = stats.one_sided_p([1.0, e(0.2)], [e(-0.3), e(-0.1)], "welch-log", slower=True)
    assert welch == pytest.approx(0.5 - 3 / (2 * math.sqrt(13)), rel=1e-9)
    # log 0 against -0.3, -0.1: pooled variance 0.02, se sqrt(0.03), t = -2 / sqrt(3), 1 d.f.
    # (Cauchy): CDF 1/2 + atan(t) / pi
    student = stats.one_sided_p([1.0], [e(-0.3), e(-0.1)], "student-log", slower=True)
    assert student == pytest.approx(0.5 - math.atan(2 / math.sqrt(3)) / math.pi, rel=1e-9)
    # identical repeats on both sides: the difference is exact
    assert stats.one_sided_p([100.0] * 3, [90.0] * 3, "welch-log", slower=True) == 0
    assert stats.one_sided_p([100.0] * 3, [90.0] * 3, "welch-log", slower=False) == 1
    assert stats.one_sided_p([100.0] * 3, [100.0] * 3, "welch-log", slower=True) == 1


def test_identical_repeats_and_near_identical_ones_raise_no_warning() -> None:
    # One side all equal: scipy warns of precision loss, which a user's -W error would raise.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        base, cur = [100.0, 105.0, 100.0, 100.0, 105.0], [95.0] * 7
        assert stats.one_sided_p(base, cur, "welch-log", slower=True) == pytest.approx(
            t_test_log_p(base, cur, False, True), rel=1e-9
        )


def test_spreads_and_quantiles_are_the_formulas() -> None:
    def spread(values: list[float]) -> float:  # 1.4826 * MAD / median
        median = statistics.median(values)
        return 1.4826 * statistics.median(abs(v - median) for v in values) / median

    rng = random.Random(7)
    for _ in range(200):
        values = draw(rng, 100.0, rng.randint(1, 15), rng.choice([None, 1.0]))
        assert relative_spread(values) == pytest.approx(spread(values), rel=1e-12, abs=1e-15)
        ordered = sorted(values)
        for n in range(1, 12):
            # Hazen's plotting positions (j + 0.5) / n, at index p * m - 0.5, interpolated
            last = len(ordered) - 1
            positions = [min(max((j + 0.5) / n * len(ordered) - 0.5, 0), last) for j in range(n)]
            expected = [
                ordered[math.floor(x)]
                + (ordered[min(math.floor(x) + 1, last)] - ordered[math.floor(x)])
                * (x - math.floor(x))
                for x in positions
            ]
            got = stats._quantiles(ordered, n)
            if n == len(ordered):
                expected = ordered
            assert got == pytest.approx(expected, rel=1e-12)


def test_spreads_by_hand() -> None:
    # median 3, absolute deviations 2 1 0 1 97: MAD 1, one wild value ignored
    assert relative_spread([1.0, 2, 3, 4, 100]) == pytest.approx(1.4826 / 3)
    # the largest drop of a recorded run below their median: 90 of 100
    assert tolerance.largest_drop([100.0, 90, 110]) == pytest.approx(0.1)
    assert tolerance.largest_drop([100.0, 100, 100]) == 0.0
    assert stats._quantiles([1.0, 2, 3, 4], 2) == pytest.approx([1.5, 3.5])


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
]


@pytest.mark.parametrize(("samples", "decided"), RECORDED)
def test_decisions_are_the_recorded_ones(
    samples: tuple[list[float], list[float], tuple[float, ...]],
    decided: tuple[str, str, float, float, float],
) -> None:
    base, cur, runs = samples
    verdict, method, p_value, tol, drop = decided
    assert not runs  # the recorded runs' level and tolerance: tests/test_checks.py
    result = compare(base, cur, tolerance=tol)
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
HEAVY = {"scipy", "numpy", "matplotlib", "pytest_benchmark", "torch"}


def test_heavy_libraries_are_imported_only_when_used() -> None:
    # One fresh interpreter for all of them: if none of them imports a heavy library, their
    # union does not either, and the first that does is named.
    code = (
        "import importlib, json, sys\n"
        f"for name in {CHEAP!r}:\n"
        "    importlib.import_module(name)\n"
        f"    heavy = sorted(set(sys.modules) & set({sorted(HEAVY)!r}))\n"
        "    print(json.dumps([name, heavy]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [name for name, _ in lines] == CHEAP
    assert [(name, heavy) for name, heavy in lines if heavy] == []
