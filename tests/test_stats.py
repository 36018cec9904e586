from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest
from scipy.stats import mannwhitneyu

from pytest_distperf.judge.stats import (
    Comparison,
    at_level,
    choose_method,
    compare,
    detectable_drop,
)
from pytest_distperf.store.entry import relative_spread

FLOOR = 0.05


def _compare(baseline: list, current: list, **kwargs: float) -> Comparison:
    """compare() at a 5% tolerance unless told otherwise."""
    return compare(baseline, current, tolerance=kwargs.pop("tolerance", FLOOR), **kwargs)


def noisy(median: float, rel_noise: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * (1 + rng.gauss(0, rel_noise)) for _ in range(n)]


def spread_pattern(median: float, rel_noise: float, n: int) -> list[float]:
    """n deterministic samples at normal quantiles: noise of a known size, free of sampling luck."""
    inv = NormalDist().inv_cdf
    return [median * (1 + rel_noise * inv((i + 0.5) / n)) for i in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_unchanged_distribution_is_ok(seed: int) -> None:
    baseline = noisy(1000.0, 0.05, 5, seed)
    current = noisy(1000.0, 0.05, 5, 1000 + seed)
    result = _compare(baseline, current, tolerance=0.2)  # 3 x the 5% noise
    assert result.verdict == "ok", result.message()


def test_thirty_percent_drop_with_five_percent_noise_is_a_regression() -> None:
    baseline = noisy(1000.0, 0.05, 5, 1)
    current = noisy(700.0, 0.05, 5, 2)
    result = _compare(baseline, current)
    assert result.verdict == "regression"
    assert result.method == "mann-whitney"
    assert result.p_value == pytest.approx(1 / 252)
    assert result.change == pytest.approx(result.current_median / result.baseline_median - 1)
    message = result.message()
    assert "regression" in message
    assert f"vs baseline {result.baseline_median:.5g} tok/s (n=5)" in message
    assert f"measured median {result.current_median:.5g} tok/s (n=5)" in message
    assert f"change {result.change:+.1%}" in message
    assert f"tolerance {result.tolerance:.1%}" in message
    assert "p=0.00397" in message


def test_big_improvement_flags_a_stale_baseline() -> None:
    result = _compare(noisy(1000.0, 0.03, 5, 3), noisy(1500.0, 0.03, 5, 4))
    assert result.verdict == "improvement"
    assert result.change > 0.4
    assert "stale" in result.message()
    assert "(Mann-Whitney U, one-sided)" in result.message()


def test_significant_drop_smaller_than_tolerance_is_ok() -> None:
    # Tight noise makes a 3% drop highly significant, but it is inside the 5% floor.
    baseline = spread_pattern(1000.0, 0.002, 5)
    current = [v * 0.97 for v in baseline]
    result = _compare(baseline, current)
    assert result.p_value <= result.alpha
    assert result.tolerance == pytest.approx(0.05)
    assert result.verdict == "ok"


def test_drop_beyond_tolerance_without_support_is_noisy() -> None:
    baseline = [100.0, 80.0, 120.0, 90.0, 110.0]
    current = [85.0, 70.0, 115.0, 95.0, 75.0]
    result = _compare(baseline, current, tolerance=0.05)
    assert result.change == pytest.approx(-0.15)
    assert result.p_value > result.alpha
    assert result.verdict == "noisy"
    assert "more repeats" in result.message()


def test_explicit_tolerance_is_used_as_given() -> None:
    baseline = spread_pattern(1000.0, 0.002, 5)
    current = [v * 0.97 for v in baseline]
    assert _compare(baseline, current, tolerance=0.02).verdict == "regression"


def test_relative_spread_ignores_one_outlier() -> None:
    assert relative_spread([100.0, 101.0, 99.0, 100.5, 99.5]) == pytest.approx(
        relative_spread([100.0, 101.0, 99.0, 100.5, 10.0]), rel=0.5
    )
    assert relative_spread([42.0]) == 0.0


def test_detectable_drop_decreases_with_repeats() -> None:
    # tolerance=0 isolates the statistical limit
    drops = [detectable_drop(spread_pattern(1000.0, 0.05, n), n, 0.0) for n in (3, 5, 10, 20)]
    assert drops == sorted(drops, reverse=True)
    assert len(set(drops)) == len(drops)
    assert 0.0 < drops[-1] < drops[0] < 1.0


def test_detectable_drop_is_at_least_the_tolerance() -> None:
    drops = [detectable_drop(spread_pattern(1000.0, noise, 5), 5, FLOOR) for noise in (0.005, 0.1)]
    assert drops[0] == pytest.approx(FLOOR)  # quiet baseline: the tolerance is the limit
    assert drops[1] > 0.15  # noisy repeats: significance is the limit
    assert detectable_drop([1.0, 1.1], 1, 1.0) == math.inf  # nothing below 100% is caught


@pytest.mark.parametrize("n", [3, 5, 8])
def test_detectable_drop_matches_compare(n: int) -> None:
    baseline = spread_pattern(1000.0, 0.05, n)
    drop = detectable_drop(baseline, n, FLOOR)
    assert _compare(baseline, [v * (1 - drop - 1e-6) for v in baseline]).verdict == "regression"
    assert _compare(baseline, [v * (1 - drop + 1e-3) for v in baseline]).verdict != "regression"
    assert _compare(baseline, baseline).detectable_drop == drop


def test_the_latest_repeats_are_rescaled_to_the_recorded_level() -> None:
    assert at_level([9.0, 10.0, 11.0], [20.0, 30.0, 25.0]) == [22.5, 25.0, 27.5]
    assert at_level([9.0, 10.0, 11.0], [30.0, 20.0]) == [18.0, 20.0, 22.0]  # the latest run's
    assert at_level([9.0, 10.0], []) == [9.0, 10.0]


def test_mann_whitney_only_where_its_smallest_p_reaches_alpha() -> None:
    assert choose_method(5, 5, 0.01) == "mann-whitney"  # 1 / C(10, 5) = 1 / 252
    assert choose_method(3, 3, 0.01) == "welch-log"  # 1 / C(6, 3) = 1 / 20
    assert choose_method(3, 3, 0.05) == "mann-whitney"


def test_three_repeats_fall_back_to_log_t_test_and_say_so() -> None:
    result = _compare(noisy(1000.0, 0.02, 3, 5), noisy(600.0, 0.02, 3, 6))
    assert result.method == "welch-log"
    assert result.verdict == "regression"
    assert "Welch t-test on log rates" in result.message()


def test_four_against_five_uses_mann_whitney() -> None:
    result = _compare(noisy(1000.0, 0.02, 4, 5), noisy(600.0, 0.02, 5, 6))
    assert result.method == "mann-whitney"
    assert result.verdict == "regression"


def test_single_sample_each_side_cannot_be_tested() -> None:
    result = _compare([1000.0], [500.0])
    assert result.method == "none"
    assert math.isnan(result.p_value)
    assert result.verdict == "noisy"
    assert math.isinf(result.detectable_drop)
    assert "no test reaches alpha=0.01 with 1 vs 1 samples" in result.message()
    assert _compare([1000.0], [990.0]).verdict == "ok"


def test_single_sample_baseline_uses_pooled_t_test() -> None:
    result = _compare([1000.0], noisy(600.0, 0.02, 5, 7))
    assert result.method == "student-log"
    assert result.tolerance == pytest.approx(0.05)
    assert result.verdict == "regression"


def test_identical_samples() -> None:
    same = _compare([100.0] * 5, [100.0] * 5)
    assert same.verdict == "ok"
    assert same.p_value == 1.0
    assert _compare([100.0] * 5, [70.0] * 5).verdict == "regression"
    assert _compare([100.0] * 3, [70.0] * 3).verdict == "regression"  # t-test, zero variance
    assert _compare([100.0] * 3, [130.0] * 3).verdict == "improvement"


def test_mann_whitney_matches_scipy_exact() -> None:
    # compare's side and plumbing; the p-values themselves: tests/test_stats_reference.py
    rng = random.Random(11)
    checked = 0
    for _ in range(20):
        base = noisy(100.0, 0.05, rng.randint(4, 9), rng.randrange(10**6))
        cur = noisy(97.0, 0.05, rng.randint(4, 9), rng.randrange(10**6))
        ours = _compare(base, cur, tolerance=0.0)
        if ours.method != "mann-whitney":
            continue
        side = "less" if ours.change <= 0 else "greater"
        expected = mannwhitneyu(cur, base, alternative=side, method="exact").pvalue
        assert ours.p_value == pytest.approx(expected, rel=1e-9)
        checked += 1
    assert checked >= 10


def test_ties_use_exact_distribution() -> None:
    # Quantized rates: 5 vs 5 with ties still reaches the exact floor when fully separated.
    result = _compare([100.0, 100.0, 101.0, 101.0, 102.0], [90.0, 90.0, 91.0, 91.0, 90.0])
    assert result.p_value == pytest.approx(1 / 252)
    assert result.verdict == "regression"


def test_large_samples_use_normal_approximation() -> None:
    result = _compare(noisy(1000.0, 0.05, 40, 8), noisy(700.0, 0.05, 40, 9))
    assert result.verdict == "regression"
    assert result.p_value < 1e-10


@pytest.mark.parametrize(
    ("baseline", "current"),
    [
        ([], [1.0]),
        ([1.0], []),
        ([0.0, 1.0], [1.0]),
        ([1.0], [-5.0]),
        ([math.nan], [1.0]),
        ([1.0], [math.inf]),
        ([True], [1.0]),
        (["7"], [1.0]),
    ],
)
def test_impossible_samples_raise(baseline: list[object], current: list[object]) -> None:
    with pytest.raises(ValueError, match="baseline|current"):
        _compare(baseline, current)  # type: ignore[arg-type]


def test_comparison_is_frozen() -> None:
    result = _compare([100.0] * 5, [100.0] * 5)
    assert isinstance(result, Comparison)
    with pytest.raises(AttributeError):
        result.verdict = "regression"  # type: ignore[misc]
