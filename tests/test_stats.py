from __future__ import annotations

import math
import random
import statistics
from statistics import NormalDist

import pytest
from scipy.stats import mannwhitneyu

from pytest_distperf.judge.significance import mann_whitney_floor
from pytest_distperf.judge.stats import (
    Comparison,
    compare,
    compare_memory,
    compare_to_recorded_runs,
)
from pytest_distperf.judge.tolerance import (
    default_tolerance,
    detectable_drop,
    drift_sigmas,
    relative_spread,
    run_drift,
)


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
    result = compare(baseline, current)
    assert result.verdict == "ok", result.message()


def test_thirty_percent_drop_with_five_percent_noise_is_a_regression() -> None:
    baseline = noisy(1000.0, 0.05, 5, 1)
    current = noisy(700.0, 0.05, 5, 2)
    result = compare(baseline, current)
    assert result.verdict == "regression"
    assert result.method == "mann-whitney"
    assert result.p_value == pytest.approx(1 / 252)
    assert result.change == pytest.approx(result.current_median / result.baseline_median - 1)
    message = result.message()
    assert "regression" in message
    assert f"baseline median {result.baseline_median:.5g} tok/s (n=5)" in message
    assert f"measured median {result.current_median:.5g} tok/s (n=5)" in message
    assert f"change {result.change:+.1%}" in message
    assert f"tolerance {result.tolerance:.1%}" in message
    assert "p=0.00397" in message


def test_big_improvement_flags_a_stale_baseline() -> None:
    result = compare(noisy(1000.0, 0.03, 5, 3), noisy(1500.0, 0.03, 5, 4))
    assert result.verdict == "improvement"
    assert result.change > 0.4
    assert "stale" in result.message()
    assert "one-sided faster" in result.message()


def test_significant_drop_smaller_than_tolerance_is_ok() -> None:
    # Tight noise makes a 3% drop highly significant, but it is inside the 5% floor.
    baseline = spread_pattern(1000.0, 0.002, 5)
    current = [v * 0.97 for v in baseline]
    result = compare(baseline, current)
    assert result.p_value <= result.alpha
    assert result.tolerance == pytest.approx(0.05)
    assert result.verdict == "ok"


def test_drop_beyond_tolerance_without_support_is_noisy() -> None:
    baseline = [100.0, 80.0, 120.0, 90.0, 110.0]
    current = [85.0, 70.0, 115.0, 95.0, 75.0]
    result = compare(baseline, current, tolerance=0.05)
    assert result.change == pytest.approx(-0.15)
    assert result.p_value > result.alpha
    assert result.verdict == "noisy"
    assert "more repeats" in result.message()


def test_explicit_tolerance_is_used_as_given() -> None:
    baseline = spread_pattern(1000.0, 0.002, 5)
    current = [v * 0.97 for v in baseline]
    assert compare(baseline, current, tolerance=0.02).verdict == "regression"


def test_default_tolerance_follows_baseline_noise() -> None:
    assert default_tolerance([100.0] * 5) == pytest.approx(0.05)
    assert default_tolerance(spread_pattern(100.0, 0.001, 5), tolerance_floor=0.0) < 0.01
    noisy_baseline = spread_pattern(100.0, 0.10, 9)
    assert default_tolerance(noisy_baseline) == pytest.approx(3 * relative_spread(noisy_baseline))
    assert default_tolerance(noisy_baseline) > 0.2


def test_relative_spread_ignores_one_outlier() -> None:
    assert relative_spread([100.0, 101.0, 99.0, 100.5, 99.5]) == pytest.approx(
        relative_spread([100.0, 101.0, 99.0, 100.5, 10.0]), rel=0.5
    )
    assert relative_spread([42.0]) == 0.0


def test_detectable_drop_decreases_with_repeats() -> None:
    # tolerance=0 isolates the statistical limit; with the default tolerance the 3-sigma
    # tolerance dominates from about 4 repeats on.
    drops = [
        detectable_drop(spread_pattern(1000.0, 0.05, n), tolerance=0.0) for n in (3, 5, 10, 20)
    ]
    assert drops == sorted(drops, reverse=True)
    assert len(set(drops)) == len(drops)
    assert 0.0 < drops[-1] < drops[0] < 1.0


def test_detectable_drop_increases_with_noise() -> None:
    drops = [detectable_drop(spread_pattern(1000.0, noise, 5)) for noise in (0.005, 0.03, 0.1)]
    assert drops == sorted(drops)
    assert drops[0] == pytest.approx(0.05)  # quiet baseline: the floor is the limit
    assert drops[-1] > 0.2


@pytest.mark.parametrize("n", [3, 5, 8])
def test_detectable_drop_matches_compare(n: int) -> None:
    baseline = spread_pattern(1000.0, 0.05, n)
    drop = detectable_drop(baseline)
    assert compare(baseline, [v * (1 - drop - 1e-6) for v in baseline]).verdict == "regression"
    assert compare(baseline, [v * (1 - drop + 1e-3) for v in baseline]).verdict != "regression"
    assert compare(baseline, baseline).detectable_drop == drop


def test_mann_whitney_floor() -> None:
    assert mann_whitney_floor(5, 5) == pytest.approx(1 / 252)
    assert mann_whitney_floor(3, 3) == pytest.approx(1 / 20)


def test_three_repeats_fall_back_to_log_t_test_and_say_so() -> None:
    result = compare(noisy(1000.0, 0.02, 3, 5), noisy(600.0, 0.02, 3, 6))
    assert result.method == "welch-log"
    assert result.verdict == "regression"
    assert "too few repeats for Mann-Whitney U" in result.message()
    assert "0.05 > alpha" in result.message()


def test_four_against_five_uses_mann_whitney() -> None:
    result = compare(noisy(1000.0, 0.02, 4, 5), noisy(600.0, 0.02, 5, 6))
    assert result.method == "mann-whitney"
    assert result.verdict == "regression"


def test_single_sample_each_side_cannot_be_tested() -> None:
    result = compare([1000.0], [500.0])
    assert result.method == "none"
    assert math.isnan(result.p_value)
    assert result.verdict == "noisy"
    assert math.isinf(result.detectable_drop)
    assert "no test can reach alpha=0.01 with 1 vs 1 samples" in result.message()
    assert compare([1000.0], [990.0]).verdict == "ok"


def test_single_sample_baseline_uses_pooled_t_test() -> None:
    result = compare([1000.0], noisy(600.0, 0.02, 5, 7))
    assert result.method == "student-log"
    assert result.tolerance == pytest.approx(0.05)
    assert result.verdict == "regression"


def test_identical_samples() -> None:
    same = compare([100.0] * 5, [100.0] * 5)
    assert same.verdict == "ok"
    assert same.p_value == 1.0
    assert compare([100.0] * 5, [70.0] * 5).verdict == "regression"
    assert compare([100.0] * 3, [70.0] * 3).verdict == "regression"  # t-test, zero variance
    assert compare([100.0] * 3, [130.0] * 3).verdict == "improvement"


def test_mann_whitney_matches_scipy_exact() -> None:
    # compare's side and plumbing; the p-values themselves: tests/test_stats_reference.py
    rng = random.Random(11)
    checked = 0
    for _ in range(20):
        base = noisy(100.0, 0.05, rng.randint(4, 9), rng.randrange(10**6))
        cur = noisy(97.0, 0.05, rng.randint(4, 9), rng.randrange(10**6))
        ours = compare(base, cur, tolerance=0.0)
        if ours.method != "mann-whitney":
            continue
        side = "less" if ours.change <= 0 else "greater"
        expected = mannwhitneyu(cur, base, alternative=side, method="exact").pvalue
        assert ours.p_value == pytest.approx(expected, rel=1e-9)
        checked += 1
    assert checked >= 10


def test_ties_use_exact_distribution() -> None:
    # Quantized rates: 5 vs 5 with ties still reaches the exact floor when fully separated.
    result = compare([100.0, 100.0, 101.0, 101.0, 102.0], [90.0, 90.0, 91.0, 91.0, 90.0])
    assert result.p_value == pytest.approx(1 / 252)
    assert result.verdict == "regression"


def test_large_samples_use_normal_approximation() -> None:
    result = compare(noisy(1000.0, 0.05, 40, 8), noisy(700.0, 0.05, 40, 9))
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
        compare(baseline, current)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"alpha": 0.0}, {"alpha": 1.0}, {"tolerance": -0.1}, {"tolerance": math.nan}],
)
def test_bad_parameters_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="alpha|tolerance"):
        compare([1.0, 2.0], [1.0, 2.0], **kwargs)


def test_comparison_is_frozen() -> None:
    result = compare([100.0] * 5, [100.0] * 5)
    assert isinstance(result, Comparison)
    with pytest.raises(AttributeError):
        result.verdict = "regression"  # type: ignore[misc]


def test_compare_memory() -> None:
    gib = 1024**3
    assert compare_memory(None, gib) is None
    assert compare_memory(gib, None) is None
    assert compare_memory(gib, int(gib * 1.05)) is None
    assert compare_memory(gib, gib // 2) is None
    message = compare_memory(gib, int(gib * 1.2))
    assert message is not None
    assert "20.0%" in message and "tolerance 10.0%" in message
    assert "1.2 GiB" in message and "baseline 1 GiB" in message
    assert compare_memory(gib, int(gib * 1.2), tolerance=0.25) is None
    assert compare_memory(0, 0) is None
    assert compare_memory(0, 10) is not None
    with pytest.raises(ValueError, match="current_bytes"):
        compare_memory(gib, -1)
    with pytest.raises(ValueError, match="tolerance"):
        compare_memory(gib, gib, tolerance=-0.1)


# --- drift between recorded runs --------------------------------------------------------------

STEADY = [100.0, 101.0, 99.0, 100.5, 99.5]  # within-run spread ~1%
DRIFTING_RUNS = [100.0, 88.0, 112.0, 95.0, 106.0]  # whole runs moved by ~10%


def _cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def test_drift_needs_enough_runs() -> None:
    assert run_drift([]) == 0.0
    assert run_drift([100.0, 120.0]) == 0.0
    # five runs: interquartile (95 .. 106 of median 100)
    assert run_drift(DRIFTING_RUNS) == pytest.approx((106.0 - 95.0) / 1.349 / 100.0)
    three = DRIFTING_RUNS[:3]  # three runs: the larger of the MAD-based spread and the CV
    assert run_drift(three) == pytest.approx(max(relative_spread(three), _cv(three)))


def test_drift_sees_a_host_with_two_speed_levels() -> None:
    # Two of three recorded runs at one level: their MAD is 0, their CV is not.
    two_levels = [100.0, 100.0, 160.0]
    assert relative_spread(two_levels) == 0.0
    assert run_drift(two_levels) == pytest.approx(_cv(two_levels))
    assert compare(STEADY, [v * 0.7 for v in STEADY], run_medians=two_levels).verdict == "ok"
    six_and_four = [100.0] * 6 + [160.0] * 4
    assert relative_spread(six_and_four) == 0.0 and run_drift(six_and_four) > 0.3


def test_drift_ignores_one_accepted_change_of_speed_among_ten() -> None:
    # A deliberate 2x speed-up recorded once: the tolerance must not open to ~90% for it.
    assert run_drift([100.0] * 9 + [200.0]) == 0.0


def test_tolerance_covers_the_drift_of_recorded_runs() -> None:
    assert default_tolerance(STEADY, 0.05) == 0.05
    with_runs = default_tolerance(STEADY, 0.05, DRIFTING_RUNS)
    assert with_runs == pytest.approx(drift_sigmas(len(DRIFTING_RUNS)) * run_drift(DRIFTING_RUNS))
    assert with_runs > 0.2


def test_few_recorded_runs_widen_the_tolerance_as_a_prediction_interval_does() -> None:
    factors = [drift_sigmas(n) for n in range(3, 12)]
    assert factors == sorted(factors, reverse=True)
    assert drift_sigmas(3) == pytest.approx(6.965 * (4 / 3) ** 0.5, rel=1e-3)  # t(2 dof), 99%
    assert drift_sigmas(10) == drift_sigmas(50) == 3.0  # never below TOLERANCE_SIGMAS
    assert drift_sigmas(3, alpha=0.05) < drift_sigmas(3)
    with pytest.raises(ValueError, match="at least 2 runs, got 1"):
        drift_sigmas(1)


def test_three_similar_records_do_not_fail_a_run_on_a_host_that_changed_speed() -> None:
    # 2 x H200 VM, cpu-110m fsdp-noreshard: three records at 151, 137 and 137 tok/s, then an
    # unchanged run at 105 (docs/benchmarks/h200-2026-11-30.md). 3 x their spread was 17%.
    records, latest = [151.0, 137.0, 137.0], [137.0 * f for f in (0.98, 1.0, 1.01, 0.99, 1.02)]
    unchanged = compare_to_recorded_runs(latest, [105.0 * f for f in (0.98, 1.0, 1.01)], records)
    assert unchanged.verdict == "ok" and unchanged.tolerance > 0.3
    assert compare_to_recorded_runs(latest, [50.0, 51.0, 49.0], records).verdict == "regression"


RATIOS = [0.30, 0.36, 0.25, 0.31, 0.29, 0.33, 0.27, 0.30, 0.34, 0.28]  # repeats spread widely
RATIO_RUNS = [0.33, 0.30, 0.31, 0.30, 0.30]  # whole runs agree; the latest one ran high


def test_recorded_runs_set_the_level_and_the_tolerance() -> None:
    latest = [v * 1.1 for v in RATIOS]  # the latest recorded run, 10% above the others
    unchanged = compare_to_recorded_runs(latest, RATIOS, RATIO_RUNS, tolerance_floor=0.05)
    assert unchanged.verdict == "ok"
    assert unchanged.baseline_median == pytest.approx(0.30)
    assert unchanged.tolerance == pytest.approx(drift_sigmas(5) * run_drift(RATIO_RUNS))
    assert unchanged.tolerance_runs == 5 and unchanged.level_runs == 5
    assert "the median of 5 recorded runs" in unchanged.message()
    # The repeats' own spread (robust CV ~12%) would have hidden a 15% drop.
    assert compare(latest, [v * 0.85 for v in RATIOS], tolerance_floor=0.05).verdict == "ok"
    slowed = compare_to_recorded_runs(latest, [v * 0.85 for v in RATIOS], RATIO_RUNS)
    assert slowed.verdict == "regression" and slowed.change == pytest.approx(-0.15)


def test_few_recorded_runs_fall_back_to_compare() -> None:
    fallback = compare_to_recorded_runs(RATIOS, RATIOS, RATIO_RUNS[:2], tolerance_floor=0.05)
    assert fallback == compare(RATIOS, RATIOS, tolerance_floor=0.05, run_medians=RATIO_RUNS[:2])
    explicit = compare_to_recorded_runs(RATIOS, RATIOS, RATIO_RUNS, tolerance=0.2)
    assert explicit.tolerance == 0.2 and explicit.tolerance_runs == 0


def test_a_run_within_the_drift_passes_and_says_why() -> None:
    slower_run = [v * 0.88 for v in STEADY]  # like the slowest recorded run
    alone = compare(STEADY, slower_run, tolerance_floor=0.05)
    assert alone.verdict == "regression"  # the repeats alone cannot know runs drift
    drift = compare(STEADY, slower_run, tolerance_floor=0.05, run_medians=DRIFTING_RUNS)
    assert drift.verdict == "ok"
    assert drift.tolerance_runs == 5
    assert "from the spread of 5 recorded runs" in drift.message()
    beyond = compare(
        STEADY, [v * 0.5 for v in STEADY], tolerance_floor=0.05, run_medians=DRIFTING_RUNS
    )
    assert beyond.verdict == "regression"


def test_detectable_drop_reports_the_drift() -> None:
    assert detectable_drop(STEADY, 5, tolerance_floor=0.05, run_medians=DRIFTING_RUNS) == (
        pytest.approx(default_tolerance(STEADY, 0.05, DRIFTING_RUNS))
    )


def test_an_explicit_tolerance_wins_over_the_drift() -> None:
    result = compare(STEADY, STEADY, tolerance=0.02, run_medians=DRIFTING_RUNS)
    assert result.tolerance == 0.02 and result.tolerance_runs == 0


def test_bad_run_medians_are_named() -> None:
    with pytest.raises(ValueError, match="run_medians: rates must be finite and positive"):
        compare(STEADY, STEADY, run_medians=[100.0, 0.0, 90.0])
