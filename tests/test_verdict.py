from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_distperf.judge.checks import (
    BaselineFigures,
    Check,
    CheckStatus,
    Decision,
    GateSettings,
    MachineFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
    baseline_check,
    machine_check,
    memory_check,
    relative_speed_check,
    skipped_check,
    threshold_check,
)
from pytest_distperf.perfmodel import Prediction
from pytest_distperf.store.entry import BaselineEntry

OK, NOTE, WARN, FAIL = CheckStatus.OK, CheckStatus.NOTE, CheckStatus.WARN, CheckStatus.FAIL

SETTINGS = GateSettings(efficiency=0.6, tolerance=None)
BASE = [100.0, 101.0, 99.0, 100.5, 99.5]


def _prediction(rate: float = 10.0) -> Prediction:
    return Prediction(
        strategy="fsdp",
        devices=4,
        tokens_per_sec=rate,
        time_per_token_s=1 / rate,
        terms={"compute": 0.01, "all_gather": 1 / rate - 0.01},
        bound="all_gather",
        bytes_per_token={"all_gather": 2.6e9},
        link_class="PHB",
        bandwidth_used=12e9,
        assumptions=(),
    )


def _entry(samples: list[float] = BASE, peak: int | None = 1000) -> BaselineEntry:
    return BaselineEntry.from_samples("t", samples, peak_memory_bytes=peak, versions={})


def test_threshold_passes_at_or_above_efficiency_times_prediction() -> None:
    check = threshold_check(_prediction(10.0), 6.0, 0.6)
    assert check.status == OK
    assert isinstance(check.figures, ThresholdFigures)
    assert check.figures.threshold_tokens_per_sec == 6.0


def test_threshold_failure_names_the_figures() -> None:
    check = threshold_check(_prediction(10.0), 3.0, 0.6)
    assert check.status == FAIL
    for text in ("fsdp", "4 device", "PHB", "predicted 10", "all-gather", "measured 3", "0.30"):
        assert text in check.message, text


def test_no_prediction_is_a_note() -> None:
    assert threshold_check(None, 3.0, 0.6).status == NOTE


def test_missing_baseline_is_a_note_listing_other_keys_or_a_failure_when_strict() -> None:
    check = baseline_check(None, BASE, SETTINGS, "cuda_h200_x2", ["cpu_x2", "cuda_h200_x2"])
    assert check.status == NOTE
    assert "no baseline for this test on this machine (topology key cuda_h200_x2)" in check.message
    assert "baselines exist for: cpu_x2" in check.message
    strict = GateSettings(efficiency=0.6, tolerance=None, strict=True)
    assert baseline_check(None, BASE, strict, "k", []).status == FAIL


def test_regression_fails_with_baseline_measured_change_tolerance() -> None:
    check = baseline_check(_entry(), [70.0, 71.0, 69.5, 70.5, 70.2], SETTINGS, "k", ["k"])
    assert check.status == FAIL
    for text in (
        "regression",
        "baseline median 100",
        "measured median 70",
        "change -29.8%",
        "tolerance",
    ):
        assert text in check.message, text
    assert _baseline(check).detectable_drop < 0.3


def test_unchanged_run_passes_and_improvement_warns_or_fails() -> None:
    assert (
        baseline_check(_entry(), [100.2, 99.8, 100.9, 99.1, 100.0], SETTINGS, "k", []).status == OK
    )
    faster = [140.0, 141.0, 139.0, 140.5, 139.5]
    assert baseline_check(_entry(), faster, SETTINGS, "k", []).status == WARN
    strict = GateSettings(efficiency=0.6, tolerance=None, fail_on_improvement=True)
    assert baseline_check(_entry(), faster, strict, "k", []).status == FAIL


def test_recorded_runs_set_the_throughput_level_not_the_latest_refresh_alone() -> None:
    # The latest refresh met the host at a slow moment (70 against 100 in the runs before it).
    slow_latest = replace(
        _entry([v * 0.7 for v in BASE]), run_medians=(100.0, 101.0, 99.0, 100.5, 70.0)
    )
    check = baseline_check(slow_latest, BASE, SETTINGS, "k", [])
    assert check.status == OK and _baseline(check).baseline_tokens_per_sec == pytest.approx(100)
    assert "the median of 5 recorded runs" in check.message
    assert baseline_check(slow_latest, [v * 0.6 for v in BASE], SETTINGS, "k", []).status == FAIL


def test_five_steady_recorded_runs_lower_the_floor_so_a_five_percent_drop_fails() -> None:
    steady = (100.0, 100.3, 99.8, 100.1, 99.9)
    slower = [v * 0.95 for v in BASE]
    three = baseline_check(replace(_entry(), run_medians=steady[:3]), slower, SETTINGS, "k", [])
    # Three runs are too few to trust their spread: the fixed floor still holds.
    assert three.status == OK and _baseline(three).tolerance == SETTINGS.tolerance_floor
    five = baseline_check(replace(_entry(), run_medians=steady), slower, SETTINGS, "k", [])
    assert five.status == FAIL and "change -5.0%" in five.message
    figures = _baseline(five)
    assert SETTINGS.settled_tolerance_floor <= figures.tolerance < 0.05
    assert figures.detectable_drop < 0.05
    unchanged = baseline_check(replace(_entry(), run_medians=steady), BASE[::-1], SETTINGS, "k", [])
    assert unchanged.status == OK


def test_five_drifting_recorded_runs_keep_a_wide_tolerance() -> None:
    drifting = replace(_entry(), run_medians=(100.0, 92.0, 107.0, 96.0, 103.0))
    check = baseline_check(drifting, [v * 0.95 for v in BASE], SETTINGS, "k", [])
    assert check.status == OK and _baseline(check).tolerance > 0.10


RELATIVE = [0.300, 0.302, 0.298, 0.301, 0.299, 0.300, 0.303, 0.297, 0.300, 0.301]


def _relative_entry(relative: list[float] = RELATIVE) -> BaselineEntry:
    return BaselineEntry.from_samples(
        "t", BASE, peak_memory_bytes=None, versions={}, relative_samples=relative
    )


def test_relative_speed_catches_a_ten_percent_slowdown_the_throughput_tolerance_hides() -> None:
    # A host whose speed drifts: throughput has a wide tolerance from its recorded runs...
    drifting = replace(_relative_entry(), run_medians=(70.0, 130.0, 85.0, 120.0, 100.0))
    slowed = [v * 0.9 for v in RELATIVE]
    throughput = baseline_check(drifting, [80.0, 81.0, 79.0], SETTINGS, "k", [])
    assert throughput.status == OK and _baseline(throughput).tolerance > 0.3
    # ...while the run's speed relative to the bare model beside it moved by the slow-down only.
    check = relative_speed_check(drifting, slowed, SETTINGS)
    assert check.status == FAIL
    assert "relative speed regression" in check.message
    assert "0.3 x bare" in check.message and "change -10.0%" in check.message
    assert _relative(check).tolerance == SETTINGS.relative_tolerance_floor
    assert relative_speed_check(drifting, RELATIVE[::-1], SETTINGS).status == OK


def test_relative_speed_from_recorded_runs_uses_their_median_and_spread() -> None:
    # The latest recorded run came out 10% high; the four before it agree with each other.
    high = [v * 1.1 for v in RELATIVE]
    runs = (0.30, 0.302, 0.299, 0.301, 0.33)
    entry = replace(_relative_entry(high), relative_run_medians=runs)
    check = relative_speed_check(entry, RELATIVE, SETTINGS)
    assert check.status == OK
    assert _relative(check).baseline == pytest.approx(0.301)
    assert _relative(check).tolerance == SETTINGS.relative_tolerance_floor
    assert "the median of 5 recorded runs" in check.message
    slowed = relative_speed_check(entry, [v * 0.85 for v in RELATIVE], SETTINGS)
    assert slowed.status == FAIL


def test_relative_speed_without_a_bare_model_or_its_baseline_is_a_note() -> None:
    assert relative_speed_check(_relative_entry(), [], SETTINGS).status == NOTE
    assert relative_speed_check(_entry(), RELATIVE, SETTINGS).status == NOTE
    assert relative_speed_check(None, RELATIVE, SETTINGS).status == NOTE


def _judged(slower_by: float, relative: list[float], host_now_s: float, host_then_s=0.013):
    """Throughput and relative checks of a run `slower_by` slower than its baseline, and the
    machine check over them with the host loop taking `host_now_s` (recorded: host_then_s)."""
    entry = replace(_relative_entry(), host_loop_run_medians=(host_then_s,))
    samples = [v * (1 - slower_by) for v in BASE]
    throughput = baseline_check(entry, samples, SETTINGS, "k", [])
    relative_check = relative_speed_check(entry, relative, SETTINGS)
    loop = [host_now_s * f for f in (0.97, 1.0, 1.02, 0.99, 1.01)]
    return throughput, relative_check, machine_check(throughput, relative_check, entry, loop)


def test_a_slower_machine_warns_instead_of_failing() -> None:
    # Bare and wrapped model 30% slower alike, and the interpreter loop 41% slower: the host.
    throughput, relative, judged = _judged(0.3, RELATIVE, host_now_s=0.022)
    assert throughput.status == FAIL and relative.status == OK
    assert judged.status == WARN
    assert _baseline(judged).verdict == "machine slower"
    machine = _machine(judged)
    assert machine.bare_change == pytest.approx(-0.3, abs=0.01)
    assert machine.host_change == pytest.approx(0.013 / 0.022 - 1)
    assert machine.change_beyond_host == pytest.approx(0.7 / (0.013 / 0.022) - 1, 0.02)
    for text in ("change -30.0%", "the machine itself ran slower", "40.9% lower", "22 ms"):
        assert text in judged.message, text


def test_a_cuda_graph_run_is_never_excused_by_a_slower_host() -> None:
    # The same figures that warn above, from steps the device replayed: the host paced nothing.
    throughput, relative, _ = _judged(0.3, RELATIVE, host_now_s=0.022)
    entry = replace(_relative_entry(), host_loop_run_medians=(0.013,))
    loop = [0.022] * 5
    assert machine_check(throughput, relative, entry, loop, host_paced=False) == throughput
    assert throughput.status == FAIL


def test_a_slower_model_on_a_steady_host_still_fails() -> None:
    # The same 30% on both the bare and the wrapped model, but the loop did not move: the
    # model's own code got slower, which the gate must not excuse.
    _, _, judged = _judged(0.3, RELATIVE, host_now_s=0.0132)
    assert judged.status == FAIL and _baseline(judged).verdict == "regression"
    assert _machine(judged).bare_change == pytest.approx(-0.3, abs=0.01)
    assert _machine(judged).host_change == pytest.approx(0.013 / 0.0132 - 1)


def test_a_slightly_slower_host_does_not_hide_a_larger_regression() -> None:
    # The loop 10% slower takes at most 10% off: a 30% drop leaves ~22%, beyond the tolerance.
    throughput, _, judged = _judged(0.3, RELATIVE, host_now_s=0.013 / 0.9)
    assert judged.status == FAIL
    assert _machine(judged).change_beyond_host == pytest.approx(0.7 / 0.9 - 1, abs=0.01)
    assert _machine(judged).change_beyond_host < -_baseline(throughput).tolerance


def test_a_slower_strategy_on_a_slower_host_still_fails() -> None:
    # Relative speed fell too: the strategy lost speed beyond what the machine explains.
    throughput, relative, judged = _judged(0.3, [v * 0.8 for v in RELATIVE], host_now_s=0.022)
    assert relative.status == FAIL and judged == throughput


def test_a_drop_the_bare_model_does_not_explain_still_fails() -> None:
    # A relative check too noisy to fail (as fsdp on CPU ranks) while the run lost more to the
    # bare model than the throughput tolerance allows: not the machine's doing.
    throughput, _, _ = _judged(0.3, RELATIVE, host_now_s=0.022)
    noisy = Check("relative_speed", OK, "", RelativeSpeedFigures(0.3, -0.15, 0.4, 0.5, 1.0, "ok"))
    entry = replace(_relative_entry(), host_loop_run_medians=(0.013,))
    judged = machine_check(throughput, noisy, entry, [0.03])
    assert _baseline(throughput).tolerance < 0.15 and judged.status == FAIL


def test_the_loop_level_comes_from_the_runs_the_throughput_level_comes_from() -> None:
    entry = replace(_relative_entry(), host_loop_run_medians=(0.013,))
    throughput = baseline_check(entry, [v * 0.7 for v in BASE], SETTINGS, "k", [])
    relative = relative_speed_check(entry, RELATIVE, SETTINGS)
    # Ten throughput runs but one loop run (a baseline recorded before the loop existed): the
    # levels would not match, so nothing is excused.
    longer = replace(entry, run_medians=(100.0,) * 10)
    assert machine_check(throughput, relative, longer, [0.03]) == throughput
    # From three runs on both levels are medians: a slow latest record does not set the loop's.
    three = replace(entry, run_medians=(100.0,) * 3, host_loop_run_medians=(0.013, 0.013, 0.03))
    judged = machine_check(throughput, relative, three, [0.03])
    assert _machine(judged).host_change == pytest.approx(0.013 / 0.03 - 1)


def test_without_the_host_loop_a_regression_stays_a_failure() -> None:
    entry = _relative_entry()  # recorded before the loop was timed
    throughput = baseline_check(entry, [v * 0.7 for v in BASE], SETTINGS, "k", [])
    relative = relative_speed_check(entry, RELATIVE, SETTINGS)
    assert machine_check(throughput, relative, entry, [0.03]) == throughput
    entry = replace(entry, host_loop_run_medians=(0.013,))
    assert machine_check(throughput, relative, entry, []) == throughput


def test_memory_growth_fails() -> None:
    assert memory_check(_entry(peak=1000), 1200, SETTINGS).status == FAIL
    assert memory_check(_entry(peak=1000), 1050, SETTINGS).status == OK
    assert memory_check(None, 1050, SETTINGS).status == NOTE


def _decision(threshold: Check, baseline: Check) -> Decision:
    skipped = (skipped_check("relative_speed", "not run"), skipped_check("memory", "not run"))
    return Decision(threshold, baseline, *skipped)


def test_decision_reports_the_worst_check() -> None:
    passing = threshold_check(_prediction(10.0), 9.0, 0.6)
    failing = baseline_check(_entry(), [70.0, 71.0, 69.5, 70.5, 70.2], SETTINGS, "k", [])
    decision = _decision(passing, failing)
    assert decision.failed
    assert decision.verdict == "FAIL (baseline)"
    assert decision.failure_text().startswith("distperf baseline check failed:")
    assert "relative_speed" not in decision.failure_text()
    noted = _decision(passing, baseline_check(None, BASE, SETTINGS, "k", []))
    assert noted.verdict == "ok" and not noted.failed
    faster = baseline_check(_entry(), [140.0, 141.0, 139.0, 140.5, 139.5], SETTINGS, "k", [])
    assert _decision(passing, faster).verdict == "WARN (baseline)"


def test_status_is_a_word_in_json_and_reads_back() -> None:
    for status in CheckStatus:
        text = json.dumps({"status": status})
        assert json.loads(text)["status"] == status.value == str(status) == f"{status}"
        assert CheckStatus.parse(json.loads(text)["status"], "row") is status
    assert [s.value for s in CheckStatus] == ["ok", "note", "warn", "fail", "skip"]
    assert CheckStatus.parse("pass", "row") is CheckStatus.OK  # reports written before the enum
    with pytest.raises(ValueError, match="row: unknown check status 'passed'"):
        CheckStatus.parse("passed", "row")


def _baseline(check: Check) -> BaselineFigures:
    assert isinstance(check.figures, BaselineFigures), check
    return check.figures


def _relative(check: Check) -> RelativeSpeedFigures:
    assert isinstance(check.figures, RelativeSpeedFigures), check
    return check.figures


def _machine(check: Check) -> MachineFigures:
    machine = _baseline(check).machine
    assert machine is not None, check
    return machine


def test_cpu_rss_growth_only_warns() -> None:
    assert memory_check(_entry(peak=1000), 1200, SETTINGS, exact=False).status == WARN


def test_nccl_transport_settings_change_the_key() -> None:
    from pytest_distperf.judge.gate import transport_suffix

    assert transport_suffix("cuda", {}) == ""
    assert transport_suffix("cuda", {"NCCL_P2P_DISABLE": "1"}) == "_nccl-p2p-disable-1"
    assert transport_suffix("cpu", {"NCCL_P2P_DISABLE": "1"}) == ""


def test_reports_are_world_readable(tmp_path) -> None:
    from pytest_distperf.output.report import write_json_report

    path = write_json_report(tmp_path / "r.json", [])
    assert path.stat().st_mode & 0o777 == 0o644


def test_missing_prediction_says_why() -> None:
    check = threshold_check(None, 3.0, 0.6, "model 'm:f': the ranks did not report its shape")
    assert check.message == (
        "no prediction for this run: model 'm:f': the ranks did not report its shape"
    )
