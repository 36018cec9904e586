from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_distperf.jsonfields import json_value
from pytest_distperf.judge.busy import (
    busy_check,
    busy_evidence,
    busy_threshold,
    cpu_change,
    machine_check,
)
from pytest_distperf.judge.checks import (
    NO_EVIDENCE,
    BaselineFigures,
    BusyEvidence,
    Check,
    CheckStatus,
    Decision,
    DeviceTimeFigures,
    GateSettings,
    MachineFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
    WorkFigures,
    baseline_check,
    memory_check,
    relative_speed_check,
    skipped_check,
)
from pytest_distperf.judge.counted import device_time_check, with_work_reason, work_check
from pytest_distperf.judge.threshold import threshold_check
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.perfmodel import Prediction
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.work import CollectiveCount, PhaseWork, Work

OK, NOTE, WARN, FAIL = CheckStatus.OK, CheckStatus.NOTE, CheckStatus.WARN, CheckStatus.FAIL
SKIP = CheckStatus.SKIP

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


# --- the counted work, the device time and the busy machine (judge/counted.py) ---------------


def _work(all_gather_bytes: float = 5.3e9, extra: dict | None = None, ops: float = 1200) -> Work:
    collectives = {"all_gather": CollectiveCount(16, all_gather_bytes), **(extra or {})}
    decode = PhaseWork(collectives, ops=ops, flops=1.4e10, kernels=None)
    return Work(decode, PhaseWork(collectives, ops=ops * 8, flops=1.1e11, kernels=None))


def _work_entry(work: Work | None = None, cpu: tuple[float, ...] = (0.01,)) -> BaselineEntry:
    return replace(_relative_entry(), work=work or _work(), host_cpu_run_medians=cpu)


def test_the_same_work_passes() -> None:
    check = work_check(_work_entry(), _work(), SETTINGS)
    assert check.status == OK
    assert check.message.startswith("the same work as the baseline: collectives per token AG 16x")


def test_a_new_collective_fails_naming_it_per_token() -> None:
    current = _work(extra={"all_reduce": CollectiveCount(12, 768)})
    check = work_check(_work_entry(), current, SETTINGS)
    assert check.status == FAIL
    assert check.message.startswith(
        "the counted work changed: all_reduce per token: 0 -> 12 calls (+768 B)"
    )
    assert "calls exact; bytes, ops, FLOPs and kernels within 1.0%" in check.message
    assert isinstance(check.figures, WorkFigures) and check.figures.more


def test_more_bytes_fail_beyond_the_work_tolerance_only() -> None:
    current = _work(5.9e9)
    check = work_check(_work_entry(), current, SETTINGS)
    assert check.status == FAIL
    assert "all_gather bytes per token: 5.3 GB -> 5.9 GB (+11%)" in check.message
    loose = replace(SETTINGS, work_tolerance=0.2)
    assert work_check(_work_entry(), current, loose).status == OK


def test_less_work_warns_as_a_stale_baseline_or_fails_when_asked() -> None:
    check = work_check(_work_entry(), _work(ops=900), SETTINGS)
    assert check.status == WARN
    assert check.message.startswith("less work than the baseline counted; the baseline looks stale")
    strict = replace(SETTINGS, fail_on_improvement=True)
    assert work_check(_work_entry(), _work(ops=900), strict).status == FAIL


def test_work_without_a_baseline_or_counts_is_a_note_or_skipped() -> None:
    assert work_check(_relative_entry(), _work(), SETTINGS).status == NOTE
    assert "no baseline of the counted work" in work_check(None, _work(), SETTINGS).message
    assert work_check(_work_entry(), None, SETTINGS).status == NOTE
    assert work_check(_work_entry(), _work(), SETTINGS, counted=False).status == SKIP


def test_device_time_is_gated_on_its_recorded_runs() -> None:
    entry = replace(_entry(), device_time_run_medians=(0.010, 0.0101, 0.0099, 0.0100, 0.0100))
    assert device_time_check(entry, 0.0100, SETTINGS).status == OK
    slower = device_time_check(entry, 0.0110, SETTINGS)
    assert slower.status == FAIL
    assert slower.message.startswith("device time per token grew: 11 ms vs baseline 10 ms")
    assert isinstance(slower.figures, DeviceTimeFigures)
    assert slower.figures.change == pytest.approx(0.1)
    faster = device_time_check(entry, 0.0090, SETTINGS)
    assert faster.status == WARN and "stale" in faster.message
    assert device_time_check(entry, None, SETTINGS).status == SKIP
    assert device_time_check(_entry(), 0.01, SETTINGS).status == NOTE


def _slowed(slower_by: float, cpu_now: float, work: Work | None = None, device: Check = None):
    """The throughput, relative and work checks of a run `slower_by` slower than its baseline
    whose CPU time per token is `cpu_now` (recorded: 0.01 s), and the CPU change."""
    entry = _work_entry()
    throughput = baseline_check(entry, [v * (1 - slower_by) for v in BASE], SETTINGS, "k", [])
    relative = relative_speed_check(entry, [v * (1 - slower_by) for v in RELATIVE], SETTINGS)
    work = work_check(entry, work or _work(), SETTINGS)
    return throughput, relative, work, cpu_change(entry, cpu_now, SETTINGS)


CPU_DEVICE = skipped_check("device_time", "cpu")


def _evidence(
    wait: float | None = None, steal: float | None = None, core: float | None = None
) -> BusyEvidence:
    return BusyEvidence(wait, steal, core)


def _wall_and_baseline_s(throughput: Check) -> tuple[float, float]:
    figures = _baseline(throughput)
    return (
        1.0 / (figures.baseline_tokens_per_sec * (1.0 + figures.change)),
        1.0 / figures.baseline_tokens_per_sec,
    )


def test_flat_cpu_time_alone_never_excuses_a_regression() -> None:
    # Half the tok/s at the same CPU time per token: a sleep, a sync or a waiting peer reads
    # so too. Without a measured wait for a core it fails, and says the rest is the rank's own.
    throughput, relative, work, cpu = _slowed(0.5, 0.0101)
    assert throughput.status == FAIL and work.status == OK
    busy, same_relative = busy_check(throughput, relative, work, CPU_DEVICE, cpu, _evidence(0.0))
    assert busy.status == FAIL and same_relative == relative
    assert (
        "\nnot a busy machine: measured outside the rank, nothing; the rest is the rank's own"
        in (busy.message)
    )
    figures = _baseline(busy).busy
    assert figures is not None and figures.host_cpu_change == pytest.approx(0.01)
    assert figures.explained_share == 0.0


def test_a_wait_for_a_core_that_explains_the_loss_is_a_busy_machine() -> None:
    throughput, relative, work, cpu = _slowed(0.5, 0.0101)
    wall_s, baseline_s = _wall_and_baseline_s(throughput)
    evidence = _evidence(wait=wall_s - baseline_s, steal=0.0, core=1.0)
    busy, _ = busy_check(throughput, relative, work, CPU_DEVICE, cpu, evidence)
    assert busy.status == WARN and _baseline(busy).verdict == "machine busy"
    assert busy.message.startswith(
        "machine busy: wall time per token +100.0%; measured outside the rank: waited 10 ms per "
        "token for a core beyond the baseline's (run queue, 100% of the lost time); without them "
        "+0.0% (tolerance 10.0%)"
    )
    assert _baseline(busy).busy.evidence == evidence
    half = busy_check(
        throughput, relative, work, CPU_DEVICE, cpu, _evidence((wall_s - baseline_s) / 2)
    )
    assert half[0].status == FAIL  # what the wait leaves is still 50% slower
    assert (
        "waited 5 ms per token for a core beyond the baseline's (run queue, 50% of the lost "
        in (half[0].message)
    )


def test_steal_and_a_slower_core_count_as_evidence_together() -> None:
    throughput, relative, work, cpu = _slowed(0.5, 0.0115)
    wall_s, baseline_s = _wall_and_baseline_s(throughput)
    # 4 ms waited, 3 ms stolen; the 13 ms left ran on a core 1.3x slower: 10 ms at baseline speed
    evidence = _evidence(wait=0.004, steal=0.003, core=1.3)
    busy, _ = busy_check(throughput, relative, work, CPU_DEVICE, cpu, evidence)
    assert busy.status == WARN
    assert "the hypervisor took 3 ms per token beyond the baseline's (steal, 30%)" in busy.message
    assert "its core ran 30.0% slower (the fixed loop's CPU time, 30%)" in busy.message
    assert _baseline(busy).busy.explained_share == pytest.approx(1.0)
    # the same without the slower core leaves 30%: fails
    assert (
        busy_check(throughput, relative, work, CPU_DEVICE, cpu, _evidence(0.004, 0.003))[0].status
        == FAIL
    )


def test_a_cpu_rise_vetoes_an_excuse_and_changed_work_is_never_excused() -> None:
    throughput, relative, work, cpu = _slowed(0.3, 0.0143)  # the code computes more
    wall_s, baseline_s = _wall_and_baseline_s(throughput)
    evidence = _evidence(wait=wall_s - baseline_s)
    busy, _ = busy_check(throughput, relative, work, CPU_DEVICE, cpu, evidence)
    assert busy.status == FAIL and "while its CPU time per token rose +43.0%" in busy.message
    # CPU time +15% on a core 15% slower is not a rise
    throughput, relative, work, cpu = _slowed(0.5, 0.0115)
    wall_s, baseline_s = _wall_and_baseline_s(throughput)
    on_slower_core = _evidence(wait=wall_s - baseline_s, core=1.15)
    assert busy_check(throughput, relative, work, CPU_DEVICE, cpu, on_slower_core)[0].status == WARN
    more = _work(extra={"all_reduce": CollectiveCount(12, 768)})
    throughput, relative, changed, cpu = _slowed(0.5, 0.01, work=more)
    assert changed.status == FAIL
    assert (
        busy_check(throughput, relative, changed, CPU_DEVICE, cpu, on_slower_core)[0].status == FAIL
    )
    grew = Check("device_time", FAIL, "device time per token grew")
    assert busy_check(throughput, relative, work, grew, cpu, on_slower_core)[0].status == FAIL


def test_the_relative_speed_is_excused_only_with_each_runs_wait_for_a_core_taken_out() -> None:
    entry = _work_entry()
    throughput = baseline_check(entry, [v * 0.5 for v in BASE], SETTINGS, "k", [])
    relative = relative_speed_check(entry, [v * 0.5 for v in RELATIVE], SETTINGS)
    work = work_check(entry, _work(), SETTINGS)
    cpu = cpu_change(entry, 0.0101, SETTINGS)
    assert relative.status == FAIL
    wall_s, _ = _wall_and_baseline_s(throughput)
    waited = _evidence(wait=wall_s / 2)
    # without those waits the pairs run at the baseline's relative speed: excused
    back = [RELATIVE[0]] * 5
    _, excused = busy_check(throughput, relative, work, CPU_DEVICE, cpu, waited, back)
    assert excused.status == WARN and excused.message.startswith(
        "machine busy: this run waited 10 ms per token for a core beyond the baseline's (run "
        "queue); with each generation's wait for a core taken out of its time, the relative "
        "speed changed +0.0%"
    )
    # still half as fast without them, no wait measured, or no pairs: not excused
    half = [v * 0.5 for v in RELATIVE]
    assert busy_check(throughput, relative, work, CPU_DEVICE, cpu, waited, half)[1] == relative
    assert busy_check(throughput, relative, work, CPU_DEVICE, cpu, _evidence(0.0), back)[1] == (
        relative
    )
    assert busy_check(throughput, relative, work, CPU_DEVICE, cpu, waited, ())[1] == relative


def test_evidence_is_measured_beyond_the_baselines_own_level() -> None:
    entry = replace(
        _work_entry(),
        run_queue_wait_run_medians=(0.002,),
        steal_run_medians=(0.0,),
        host_loop_run_medians=(0.020,),
    )
    evidence = busy_evidence(entry, 0.005, 0.001, [0.023, 0.023, 0.024])
    assert evidence.run_queue_wait_per_token_s == pytest.approx(0.003)
    assert evidence.steal_per_token_s == pytest.approx(0.001)
    assert evidence.core_slowdown == pytest.approx(1.15)
    assert busy_evidence(entry, 0.001, None, [0.018]).run_queue_wait_per_token_s == 0.0
    assert busy_evidence(entry, 0.001, None, [0.018]).core_slowdown == 1.0  # never below 1
    # a baseline recorded before the waits were: nothing to measure beyond, nothing excused
    old = busy_evidence(_work_entry(), 0.005, 0.001, [0.023])
    assert old == BusyEvidence(None, None, None)
    assert busy_evidence(None, 0.005, 0.001, [0.023]) == old
    assert json_value(old) == {  # as the JSON report writes it
        "run_queue_wait_per_token_s": None,
        "steal_per_token_s": None,
        "core_slowdown": None,
    }


def _missed_threshold(measured: float) -> Check:
    prediction = _prediction(100.0)
    return threshold_check(prediction, measured, 0.7)


def test_a_threshold_missed_while_waiting_for_a_core_is_a_busy_machine() -> None:
    missed = _missed_threshold(40.0)  # against a threshold of 70 tok/s
    assert missed.status == FAIL
    work = Check("work", OK, "same")
    busy = busy_threshold(missed, work, 76.92)  # the rate without the waits for a core
    assert busy.status == WARN
    assert busy.message.startswith(
        "machine busy: without the ranks' wait for a core (run queue, measured on their timing "
        "threads) it ran at 76.92 tok/s, above the threshold 70 tok/s"
    )
    assert busy_threshold(missed, work, 59.0).status == FAIL
    assert busy_threshold(missed, work, None) == missed
    assert busy_threshold(missed, Check("work", FAIL, "more"), 76.92) == missed
    met = _missed_threshold(90.0)
    assert busy_threshold(met, work, 76.92) == met


def test_without_cpu_time_or_evidence_a_regression_stays_a_failure() -> None:
    entry = _work_entry(cpu=())
    assert cpu_change(entry, 0.01, SETTINGS) is None
    assert cpu_change(_work_entry(), None, SETTINGS) is None
    throughput, relative, work, _ = _slowed(0.5, 0.01)
    busy, same = busy_check(throughput, relative, work, CPU_DEVICE, None, NO_EVIDENCE)
    assert busy.status == FAIL and same == relative


def test_a_failed_throughput_check_says_whether_the_work_changed() -> None:
    throughput, _, same, cpu = _slowed(0.3, 0.0143)
    reason = with_work_reason(throughput, same, cpu)
    assert reason.message.endswith(
        "\nthe counted work is the baseline's: the same work got slower (CPU time per token +43.0%)"
    )
    changed = work_check(_work_entry(), _work(extra={"send": CollectiveCount(1, 8)}), SETTINGS)
    assert with_work_reason(throughput, changed, None).message.endswith(
        "\nthe counted work changed: send per token: 0 -> 1 calls (+8 B); "
        "send per prefill: 0 -> 1 calls (+8 B)"
    )
    unknown = work_check(None, _work(), SETTINGS)
    assert with_work_reason(throughput, unknown, None) == throughput
    passing = baseline_check(_work_entry(), BASE, SETTINGS, "k", [])
    assert with_work_reason(passing, changed, None) == passing


def test_the_decision_holds_the_work_and_device_time_checks() -> None:
    passing = threshold_check(_prediction(10.0), 9.0, 0.6)
    changed = work_check(_work_entry(), _work(extra={"send": CollectiveCount(1, 8)}), SETTINGS)
    decision = replace(
        _decision(passing, baseline_check(None, BASE, SETTINGS, "k", [])), work=changed
    )
    assert decision.verdict == "FAIL (work)"
    assert "distperf work check failed:\nthe counted work changed" in decision.failure_text()
    assert not replace(decision, gates=False).failed
    assert [c.name for c in decision.checks][-3:] == ["work", "device_time", "loss"]


def _run(
    slower: float = 1.0, work: Work | None = None, cpu: float = 0.01, wait: float | None = 0.0
) -> RunResult:
    spec = RunSpec("t.py::t", "auto", 1, "cpu", Workload(), repeats=5, warmup=0, timeout=9.0)
    rank = RankResult(
        rank=0,
        samples=tuple(Sample(t * slower, None, None) for t in (1.0, 1.01, 0.99, 1.0, 1.005)),
        peak_memory_bytes=1,
        memory_kind="process RSS peak",
        implementation=Implementation("SingleDeviceStrategy", "replicated", "", "none"),
        versions={},
        device_name="cpu",
        tokens=((1,),),
        replicas=1,
        timed_from=1.0,
        work=work or _work(),
        host_cpu_per_token_s=cpu,
        run_queue_wait_per_token_s=wait,
    )
    return RunResult(spec, (rank,), launch_s=1.0, launched_at=0.0)


def test_the_gate_records_the_work_and_judges_the_next_run_by_it(tmp_path) -> None:
    from pytest_distperf.judge.gate import Gate
    from pytest_distperf.store.store import BaselineStore
    from pytest_distperf.topology import probe

    store = BaselineStore(tmp_path)
    recording = Gate(probe("cpu", 1), store, update=True)
    decision = recording.decide(_run(), SETTINGS, None)
    assert decision.work.status == SKIP
    assert recording.record(_run(), decision, None)
    [entry] = store.load(recording.topology_key).values()
    assert entry.work == _work() and entry.host_cpu_run_medians == (0.01,)

    gate = Gate(probe("cpu", 1), store)
    assert gate.decide(_run(), SETTINGS, None).work.status == OK
    more = _work(extra={"all_reduce": CollectiveCount(12, 768)})
    changed = gate.decide(_run(work=more), SETTINGS, None)
    assert changed.failed and changed.verdict == "FAIL (work)"
    # the same CPU time per token, no wait for a core measured: the rank's own slow-down
    waited = gate.decide(_run(slower=2.0), SETTINGS, None)
    assert waited.verdict == "FAIL (baseline)"
    assert "not a busy machine: measured outside the rank, nothing" in waited.baseline.message
    # the same, its threads waiting for a core the lost time per token (1/32 s): a neighbour
    busy = gate.decide(_run(slower=2.0, wait=1 / 32), SETTINGS, None)
    assert busy.verdict == "WARN (baseline)" and not busy.failed
    assert busy.baseline.message.startswith("machine busy: wall time per token +100.0%; measured")
    assert busy.busy_evidence is not None
    assert busy.busy_evidence.run_queue_wait_per_token_s == pytest.approx(1 / 32)
    slower = gate.decide(_run(slower=2.0, cpu=0.02), SETTINGS, None)
    assert slower.verdict == "FAIL (baseline)"
    assert slower.baseline.message.endswith("the same work got slower (CPU time per token +100.0%)")
    both = gate.decide(_run(slower=2.0, work=more), SETTINGS, None)
    assert both.verdict == "FAIL (baseline, work)"
    assert "\nthe counted work changed: all_reduce per token: 0 -> 12" in both.baseline.message
    uncounted = _run()
    uncounted = replace(uncounted, spec=replace(uncounted.spec, count_work=False))
    assert gate.decide(uncounted, SETTINGS, None).work.status == SKIP
