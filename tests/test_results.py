from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_figures import JSON_KEYS

from pytest_distperf.judge.checks import (
    BaselineFigures,
    Check,
    CheckStatus,
    Decision,
    DetectableFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
    skipped_check,
)
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.output.markdown import SummaryRow, parse_report, render_markdown
from pytest_distperf.output.report import (
    format_result_line,
    junit_properties,
    result_header,
    write_json_report,
)
from pytest_distperf.spec import RunSpec, Workload


def _rank(
    rank: int, totals: list[float], bare: list[float], host: tuple[float, ...] = ()
) -> RankResult:
    return RankResult(
        rank=rank,
        samples=tuple(Sample(t, 0.01, t - 0.01) for t in totals),
        peak_memory_bytes=0,
        memory_kind="cuda allocator peak",
        implementation=Implementation("FSDPStrategy", "FSDP1 FULL_SHARD", "nccl", "FSDP"),
        versions={},
        device_name="gpu",
        tokens=((1,),),
        replicas=2,
        timed_from=0.0,
        bare_samples=tuple(Sample(t, 0.01, t - 0.01) for t in bare),
        host_loop_s=host,
    )


def _result(*ranks: RankResult) -> RunResult:
    spec = RunSpec("t", "fsdp", len(ranks), "cuda", Workload(), repeats=2, warmup=0, timeout=9.0)
    return RunResult(spec, ranks, launch_s=1.0, launched_at=0.0)


def test_relative_speed_pairs_each_repeat_with_the_bare_run_beside_it() -> None:
    # Repeat 2 ran on a host twice as slow: the wrapped and the bare runs both took twice as long.
    result = _result(_rank(0, [1.0, 2.0], [0.30, 0.60]), _rank(1, [1.1, 2.0], [0.33, 0.50]))
    # Slowest rank per repeat on each side: 0.33 / 1.1 and 0.60 / 2.0.
    assert result.relative_speed_samples == pytest.approx((0.3, 0.3))
    assert result.relative_speed == pytest.approx(0.3)


def test_no_relative_speed_when_a_rank_had_no_bare_model() -> None:
    result = _result(_rank(0, [1.0, 2.0], [0.3, 0.6]), _rank(1, [1.0, 2.0], []))
    assert result.relative_speed_samples == ()
    assert result.relative_speed is None


def test_host_loop_per_repeat_is_the_slowest_ranks() -> None:
    result = _result(
        _rank(0, [1.0, 2.0], [], (0.013, 0.025)), _rank(1, [1.0, 2.0], [], (0.014, 0.022))
    )
    assert result.host_loop_samples == (0.014, 0.025)
    assert (
        _result(
            _rank(0, [1.0, 2.0], [], (0.013, 0.025)), _rank(1, [1.0, 2.0], [])
        ).host_loop_samples
        == ()
    )


# --- the judged run's record and what the reports make of it -----------------------------------

BASELINE = BaselineFigures(
    baseline_tokens_per_sec=25.5,
    change=-0.335,
    tolerance=0.2,
    tolerance_runs=0,
    p_value=0.004,
    detectable_drop=0.208,
    verdict="regression",
    recorded_at="2026-01-02T03:04:05+00:00",
    commit=None,
)
RELATIVE = RelativeSpeedFigures(0.3, 0.038, 0.05, 0.2, 0.135, "ok")
THRESHOLD = ThresholdFigures(40.0, 12.0, 0.3, "compute", "single-rank compute", "NV18", 0.42)


def _decision(
    baseline: Check | None = None, relative: Check | None = None, memory: Check | None = None
) -> Decision:
    return Decision(
        threshold=Check("threshold", CheckStatus.OK, "above the threshold", THRESHOLD),
        baseline=baseline or Check("baseline", CheckStatus.FAIL, "regression", BASELINE),
        relative_speed=relative
        or Check("relative_speed", CheckStatus.OK, "within tolerance", RELATIVE),
        memory=memory or Check("memory", CheckStatus.OK, "peak memory within tolerance"),
    )


def _record(decision: Decision | None = None, **changes: object) -> JudgedRun:
    result = _result(
        _rank(0, [1.0, 2.0], [0.3, 0.6], (0.013, 0.025)),
        _rank(1, [1.1, 2.0], [0.33, 0.5], (0.014, 0.022)),
    )
    record = JudgedRun.of(
        result,
        decision or _decision(),
        prediction=None,
        topology_key="cuda_h200_x2",
        baseline_recorded=False,
        calibration=None,
        session_started_at=-5.0,
    )
    return replace(record, **changes)


# Field names users' scripts and CI templates read (pinned once, in test_figures.py): a rename
# must be a decision, not an accident. This record ran no work or device-time check.
NOT_COUNTED = {"work_status", "work_message", "off_cpu_share_change"}
NO_DEVICE_TIME = {"device_time_status", "device_time_message", "device_time_change"}
JSON_FIELDS = JSON_KEYS - NOT_COUNTED - NO_DEVICE_TIME


def test_the_json_row_keeps_its_field_names_and_plain_values() -> None:
    row = _record().to_dict()
    assert set(row) == JSON_FIELDS
    assert json.loads(json.dumps(row)) == row  # plain JSON: lists, not tuples; words, not enums
    assert (row["baseline_status"], row["threshold_status"]) == ("fail", "ok")
    assert type(row["baseline_status"]) is str
    assert row["verdict"] == "FAIL (baseline)" and row["baseline_verdict"] == "regression"
    assert row["relative_speed_change"] == 0.038 and row["baseline_runs_needed"] == 0
    assert row["workload"]["max_new_tokens"] == 32 and row["implementation"]["backend"] == "nccl"
    assert row["session_to_first_timed_s"] == 5.0
    assert row["relative_speed_samples"] == pytest.approx([0.3, 0.3])


def test_a_check_that_did_not_run_leaves_no_fields() -> None:
    why = "not compared: this run records the baseline"
    decision = _decision(
        baseline=Check("baseline", CheckStatus.NOTE, "catch 20%", DetectableFigures(0.2)),
        relative=skipped_check("relative_speed", why),
        memory=skipped_check("memory", why),
    )
    row = _record(decision).to_dict()
    assert set(row) == JSON_FIELDS - {
        *("relative_speed_baseline", "relative_speed_change", "relative_speed_tolerance"),
        *("relative_speed_p_value", "relative_speed_detectable_drop", "relative_speed_verdict"),
        *("relative_speed_status", "relative_speed_message", "memory_status", "memory_message"),
        *("baseline_tokens_per_sec", "change", "tolerance", "tolerance_runs", "p_value"),
        *("baseline_verdict", "baseline_recorded_at", "baseline_commit"),
        "baseline_runs_needed",
    }
    assert row["detectable_drop"] == 0.2 and "change" not in row
    assert row["verdict"] == "ok"


def test_junit_properties_keep_their_names_and_leave_out_what_is_missing() -> None:
    properties = dict(junit_properties(_record()))
    assert properties["distperf_tokens_per_sec"] == _record().run.tokens_per_sec
    assert properties["distperf_ttft_ms"] == pytest.approx(10.0)
    assert properties["distperf_verdict"] == "FAIL (baseline)"
    assert list(properties)[:6] == [
        "distperf_tokens_per_sec",
        "distperf_decode_tokens_per_sec",
        "distperf_strategy",
        "distperf_devices",
        "distperf_accelerator",
        "distperf_topology_key",
    ]
    bare = _decision(baseline=Check("baseline", CheckStatus.NOTE, "no baseline"))
    names = [name for name, _ in junit_properties(_record(bare))]
    assert "distperf_change" not in names and "distperf_detectable_drop" not in names
    assert "distperf_relative_speed_change" in names


def test_result_line_shows_the_relative_speed_change_and_what_it_can_detect() -> None:
    record = _record()
    line = format_result_line(record, "passed")
    assert "-33.5%    21%   +3.8%    14%  FAIL (baseline)" in line
    assert line.endswith(" t") and "2 x cuda" in line and "compute" in line
    assert "rel.chg detect  verdict" in result_header()
    without = _decision(relative=Check("relative_speed", CheckStatus.NOTE, "no bare model"))
    passing = replace(without, baseline=replace(without.baseline, status=CheckStatus.OK))
    assert "      -      -  ok" in format_result_line(_record(passing), "passed")
    assert "FAILED" in format_result_line(record, "failed")


def test_markdown_from_a_record_matches_markdown_from_its_saved_row(tmp_path) -> None:
    records = [_record(), _record(_decision(memory=Check("memory", CheckStatus.WARN, "grew")))]
    path = write_json_report(tmp_path / "report.json", records)
    saved = parse_report(json.loads(path.read_text()))
    assert saved == [SummaryRow.from_json(record.to_dict(), "record") for record in records]
    text = render_markdown(saved, title="t")
    assert "| `t` | fsdp | 2 |" in text and "**FAIL (baseline)**" in text
    assert "- `t` memory: grew" in text and "- `t` baseline: regression" in text


@pytest.mark.parametrize(("strategy", "batch"), [("auto", 1), ("tp", 4)])
def test_bandwidth_utilization_counts_one_weight_read_per_forward(
    strategy: str, batch: int
) -> None:
    # A forward reads a rank's share of the weights once and yields a token for each batch row.
    from distperf_model.config import PRESETS

    from pytest_distperf.perfmodel import (
        Calibration,
        CollectiveFigure,
        links_from_calibration,
    )
    from pytest_distperf.strategies import predict_for

    figures = {
        op: (CollectiveFigure.from_time(op, 1 << 20, 50e-6, 2),)
        for op in ("all_gather", "all_reduce")
    }
    calibration = Calibration(
        world_size=2,
        backend="nccl",
        device_type="cuda",
        **figures,
        latency_s=10e-6,
        memory_bandwidth=1e12,
    )
    links = links_from_calibration(calibration, "NV18")
    shape = PRESETS["pythia-1b"]
    prediction = predict_for(shape, strategy, 2, links, compute_time_s=0.01, batch_size=batch)
    replicated = predict_for(shape, "auto", 2, links, compute_time_s=0.01)
    whole = replicated.bytes_per_token["weights_read"]
    share = prediction.terms["compute"] / 0.01  # tp: the split linears halved, the rest whole
    assert (share == 1.0) == (strategy == "auto") and share > 0.5
    assert prediction.bytes_per_token["weights_read"] == pytest.approx(whole * share)
    record = replace(_record(), prediction=prediction, calibration=calibration)
    forwards = record.run.decode_tokens_per_sec / batch  # type: ignore[operator]
    assert record.bandwidth_utilization == pytest.approx(whole * share * forwards / 1e12)


def test_each_phase_is_the_slowest_ranks_and_verbose_shows_what_measuring_cost() -> None:
    from pytest_distperf.output.report import phase_line, result_lines

    phases = {"join": 0.1, "calibrate": 2.0, "timed": 4.0, "bare": 1.5}
    slower = {**phases, "calibrate": 3.0, "count": 0.5}

    def judged(*ranks: RankResult) -> JudgedRun:
        return JudgedRun.of(
            _result(*ranks),
            _decision(),
            prediction=None,
            topology_key="cuda_h200_x2",
            baseline_recorded=False,
            calibration=None,
            session_started_at=-5.0,
        )

    first, second = _rank(0, [1.0, 2.0], [0.3, 0.6]), _rank(1, [1.1, 2.0], [0.33, 0.5])
    record = judged(replace(first, phase_s=phases), replace(second, phase_s=slower))
    assert record.to_dict()["phase_s"] == slower
    line = phase_line(record)
    assert line == (
        "    phases, s: join 0.10, calibrate 3.00, timed 4.00, bare 1.50, count 0.50; "
        "bare + count = 50% of timed"
    )
    outcomes = {record.run.test_id: "passed"}
    assert result_lines([record], outcomes, verbose=True)[-1] == line
    assert len(result_lines([record], outcomes, verbose=False)) == 2
    # a rank without phases (a result from before they were timed): nothing to show
    assert phase_line(judged(replace(first, phase_s=phases), second)) == ""
