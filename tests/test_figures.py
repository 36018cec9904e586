"""The run's figures, one record (`RunResult`, reduced once by `reduce_ranks`), and every
output that reads it: the JSON report and `RunResult.to_dict()`, the JUnit properties,
pytest-benchmark's `extra_info`, the terminal table and the Markdown summary."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest

from pytest_distperf.jsonfields import json_value
from pytest_distperf.judge.checks import (
    BaselineFigures,
    Check,
    CheckStatus,
    Decision,
    DeviceTimeFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
    WaitFigures,
)
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.output.benchmark_session import EXTRA_INFO, extra_info
from pytest_distperf.output.markdown import SummaryRow
from pytest_distperf.output.report import (
    COUNTED,
    SCALARS,
    format_result_line,
    junit_properties,
    result_header,
)
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.work import CollectiveCount, PhaseWork, Work
from pytest_distperf.xdist import Payload, attach, detach

# --- what users' scripts read: the names as they were before the declaration ------------------

# Every key of a JSON row whose checks all ran (with a machine check beside the baseline's).
JSON_KEYS = frozenset(
    {
        *("test_id", "strategy", "devices", "accelerator", "workload", "repeats", "warmup"),
        "nodes",
        *("tokens_per_sec", "tokens_per_sec_samples", "decode_tokens_per_sec"),
        *("aggregate_tokens_per_sec", "ttft_s", "peak_memory_bytes", "peak_memory_per_rank"),
        *("memory_kind", "implementation", "device_name", "versions", "launch_s", "startup_s"),
        *("reference_token_s", "relative_speed", "relative_speed_samples", "host_loop_samples"),
        "reference_source",
        "host_loop_cpu_samples",
        *(
            "work_s",
            "harness_s",
            "compile_s",
            "count_s",
            "compiled",
            "cuda_graphs",
            "graph_breaks",
        ),
        *("bandwidth_utilization", "verdict"),
        *("work", "host_cpu_per_token_s", "run_queue_wait_per_token_s"),
        *("steal_per_token_s", "off_cpu_share", "busy_evidence", "phase_s"),
        "device_time_per_token_s",
        *("work_status", "work_message", "device_time_status", "device_time_message"),
        *("off_cpu_share_change", "device_time_change"),
        *("predicted_tokens_per_sec", "threshold_tokens_per_sec", "efficiency", "bound"),
        *("bound_description", "link_class", "ratio_to_predicted"),
        *("threshold_status", "threshold_message"),
        *("baseline_tokens_per_sec", "change", "tolerance", "tolerance_runs", "p_value"),
        *("detectable_drop", "baseline_verdict", "baseline_recorded_at", "baseline_commit"),
        *("baseline_runs_needed", "baseline_status", "baseline_message"),
        *("relative_speed_baseline", "relative_speed_change", "relative_speed_tolerance"),
        *("relative_speed_p_value", "relative_speed_detectable_drop", "relative_speed_verdict"),
        *("relative_speed_status", "relative_speed_message", "memory_status", "memory_message"),
        *("topology_key", "baseline_recorded", "prediction", "calibration"),
        "session_to_first_timed_s",
        *("mode", "step_time_s", "mfu", "loss", "reference_loss", "reference_step_s"),
        *("model_flops_per_step", "peak_flops", "peak_flops_source"),
        "model_source",
    }
)
# The keys of `RunResult.to_dict()`, the unjudged run's row.
RUN_KEYS = frozenset(
    {
        *("test_id", "strategy", "devices", "accelerator", "workload", "repeats", "warmup"),
        "nodes",
        *("tokens_per_sec", "tokens_per_sec_samples", "decode_tokens_per_sec"),
        *("aggregate_tokens_per_sec", "ttft_s", "peak_memory_bytes", "peak_memory_per_rank"),
        *("memory_kind", "implementation", "device_name", "versions", "launch_s", "startup_s"),
        *("work_s", "harness_s", "reference_token_s", "relative_speed", "relative_speed_samples"),
        *("host_loop_samples", "work", "host_cpu_per_token_s", "device_time_per_token_s"),
        "host_loop_cpu_samples",
        "run_queue_wait_per_token_s",
        *("steal_per_token_s", "off_cpu_share"),
        "reference_source",
        *("mode", "step_time_s", "mfu", "loss", "reference_loss", "reference_step_s"),
        *("model_flops_per_step", "peak_flops", "peak_flops_source"),
        *("compile_s", "count_s", "compiled", "cuda_graphs", "graph_breaks", "phase_s"),
        "model_source",
    }
)
# JUnit XML properties, in this order.
JUNIT_NAMES = (
    *("distperf_tokens_per_sec", "distperf_decode_tokens_per_sec", "distperf_strategy"),
    *("distperf_devices", "distperf_accelerator", "distperf_topology_key"),
    *("distperf_predicted_tokens_per_sec", "distperf_threshold_tokens_per_sec"),
    *("distperf_bound", "distperf_baseline_tokens_per_sec", "distperf_change"),
    *("distperf_tolerance", "distperf_detectable_drop", "distperf_relative_speed"),
    *("distperf_relative_speed_change", "distperf_relative_speed_detectable_drop"),
    *("distperf_verdict", "distperf_peak_memory_bytes", "distperf_ttft_ms"),
    *("distperf_work", "distperf_host_cpu_per_token_s", "distperf_run_queue_wait_per_token_s"),
    "distperf_device_time_per_token_s",
    "distperf_mode",  # a generation has no step_time_s, mfu or loss: left out
)
# pytest-benchmark's extra_info, in this order.
BENCHMARK_EXTRA_KEYS = (
    *(name.removeprefix("distperf_") for name in JUNIT_NAMES[:-6]),
    *("tokens_per_sec_samples", "aggregate_tokens_per_sec", "ttft_s"),
    *("work", "host_cpu_per_token_s", "run_queue_wait_per_token_s", "device_time_per_token_s"),
    "mode",
    "workload",
    *("implementation", "device_name", "bound_description", "link_class"),
    "new_tokens_per_generation",
)
RESULT_HEADER_TEXT = (
    "     tok/s    decode  ttft ms strategy        ranks     predicted bound         "
    "work           baseline  change detect rel.chg detect  verdict            test"
)
WORK = Work(
    decode=PhaseWork({"all_gather": CollectiveCount(16, 5.3e9)}, ops=1200, flops=1.4e10),
    prefill=PhaseWork({"all_gather": CollectiveCount(16, 5.3e9)}, ops=9000, flops=1.1e11),
)


def _rank(rank: int, totals: tuple[float, ...]) -> RankResult:
    return RankResult(
        rank=rank,
        samples=tuple(Sample(t, 0.01, t - 0.01) for t in totals),
        peak_memory_bytes=1000 + rank,
        memory_kind="cuda allocator peak",
        implementation=Implementation("FSDPStrategy", "FSDP1 FULL_SHARD", "nccl", "FSDP"),
        versions={"torch": "2.13.0"},
        device_name="gpu",
        tokens=((1,),),
        replicas=2,
        timed_from=1.0,
        bare_samples=tuple(Sample(t / 3, 0.01, t / 3 - 0.01) for t in totals),
        host_loop_s=(0.013, 0.025),
        work_s=1.5,
        compile_s=None,
        work=WORK,
        host_cpu_per_token_s=0.01 + rank / 1000,
        run_queue_wait_per_token_s=0.002 + rank / 1000,
        device_time_per_token_s=0.005,
    )


def _result() -> RunResult:
    spec = RunSpec("t", "fsdp", 2, "cuda", Workload(), repeats=2, warmup=0, timeout=9.0)
    ranks = (_rank(0, (1.0, 2.0)), _rank(1, (1.1, 2.0)))
    return RunResult(spec, ranks, launch_s=2.0, launched_at=0.0)


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
    waits=WaitFigures(0.25, 0.02, 0.23, 0.05, 0.0),
)
THRESHOLD = ThresholdFigures(40.0, 12.0, 0.3, "compute", "single-rank compute", "NV18", 0.42)
RELATIVE = RelativeSpeedFigures(0.3, 0.038, 0.05, 0.2, 0.135, "ok")


def _record(result: RunResult | None = None) -> JudgedRun:
    decision = Decision(
        threshold=Check("threshold", CheckStatus.OK, "above the threshold", THRESHOLD),
        baseline=Check("baseline", CheckStatus.FAIL, "regression", BASELINE),
        relative_speed=Check("relative_speed", CheckStatus.OK, "within tolerance", RELATIVE),
        memory=Check("memory", CheckStatus.OK, "peak memory within tolerance"),
        work=Check("work", CheckStatus.OK, "the same work"),
        device_time=Check(
            "device_time", CheckStatus.OK, "within", DeviceTimeFigures(0.005, 0.01, 0.02, "ok")
        ),
    )
    return JudgedRun.of(
        result or _result(),
        decision,
        prediction=None,
        topology_key="cuda_h200_x2",
        baseline_recorded=False,
        calibration=None,
        session_started_at=-5.0,
    )


def test_the_json_row_keeps_every_key() -> None:
    row = _record().to_dict()
    assert set(row) == JSON_KEYS
    assert json.loads(json.dumps(row)) == row


def test_the_run_row_holds_every_figure_of_the_record() -> None:
    result = _result()
    row = result.to_dict()
    assert set(row) == RUN_KEYS
    raw = {"spec", "ranks", "launched_at", "samples"}  # what the row does not repeat
    assert {f.name for f in dataclasses.fields(RunResult)} == RUN_KEYS | raw
    assert all(row[name] == json_value(getattr(result, name)) for name in RUN_KEYS)


def test_a_figure_without_its_reduction_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_distperf import measured

    reduce = measured.reduce_ranks
    monkeypatch.setattr(measured, "reduce_ranks", lambda *args: {**reduce(*args), "util": 0.5})
    with pytest.raises(TypeError, match=r"RunResult and reduce_ranks differ: \['util'\]"):
        _result()


def test_junit_properties_keep_their_names_and_order() -> None:
    properties = junit_properties(_record())
    assert tuple(name for name, _ in properties) == JUNIT_NAMES
    assert dict(properties)["distperf_ttft_ms"] == pytest.approx(10.0)


def test_benchmark_extra_info_keeps_its_keys_and_order() -> None:
    assert tuple(extra_info(_record())) == BENCHMARK_EXTRA_KEYS


def test_the_table_header_is_unchanged() -> None:
    assert result_header() == RESULT_HEADER_TEXT


def test_every_output_names_keys_of_the_json_row() -> None:
    # A misspelt name would read as a figure the run has not: a silent "-" or a missing key.
    keys = JSON_KEYS | {"loss_status", "loss_message"}
    assert set(SCALARS) | set(COUNTED) | set(EXTRA_INFO) <= keys
    read = {f.name for f in dataclasses.fields(SummaryRow)} - {"messages"}
    assert read <= keys


# A generation's record has no training figures: JUnit and extra_info leave out what is None.
def test_a_figure_none_for_this_run_is_null_in_json_and_left_out_elsewhere() -> None:
    result = _result()
    ranks = tuple(replace(r, samples=(Sample(1.0, None, None),) * 2) for r in result.ranks)
    record = _record(RunResult(result.spec, ranks, 2.0, 0.0))
    assert record.to_dict()["ttft_s"] is None and record.to_dict()["decode_tokens_per_sec"] is None
    assert "distperf_ttft_ms" not in dict(junit_properties(record))
    assert "ttft_s" not in extra_info(record)
    assert "        -" in format_result_line(record, "passed")  # ttft and decode: "-"


def test_reductions_over_ranks() -> None:
    result = _result()
    assert result.device_name == "gpu"
    assert result.peak_memory_per_rank == (1000, 1001)
    assert result.peak_memory_bytes == 1001  # the busiest rank's
    assert result.host_cpu_per_token_s == 0.011  # the slowest rank's
    assert result.compile_s is None  # no rank reports one

    def with_first(**changes: object) -> RunResult:
        first = replace(result.ranks[0], **changes)
        return RunResult(result.spec, (first, *result.ranks[1:]), 2.0, 0.0)

    assert with_first(count_s=2.0).count_s is None  # the other may have been slowest
    # The whole model timed alone (or compiling it): any rank's stands for the run's.
    assert with_first(compile_s=2.0).compile_s == 2.0
    assert with_first(reference_token_s=0.002).reference_token_s == 0.002
    assert with_first(work=None).work is None  # a rank without counts: none for the run


def test_json_values_are_plain() -> None:
    value = {"counts": (1, 2), "kind": CheckStatus.OK, "what": Implementation("a", "b", "c", "d")}
    assert json_value(value) == {
        "counts": [1, 2],
        "kind": "ok",
        "what": {"fabric_strategy": "a", "sharding": "b", "backend": "c", "wrapper": "d"},
    }


def test_the_record_is_read_only_and_travels_to_the_xdist_controller() -> None:
    record = _record()
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.run.tokens_per_sec = 1.0  # type: ignore[misc]
    payload = detach(_attached(record))
    assert isinstance(payload, Payload)
    assert payload.records[0].to_dict() == record.to_dict()
    assert payload.records[0].run == record.run


def _attached(record: JudgedRun) -> pytest.TestReport:
    report = pytest.TestReport("t", ("t.py", 1, "t"), {}, "passed", None, "call")
    attach(report, Payload((record,), None))
    return report


def test_the_counted_work_and_its_check_reach_every_output() -> None:
    record = _record()
    row = record.to_dict()
    assert row["work"] == WORK.to_json()
    assert row["work"]["decode"]["collectives"]["all_gather"] == {"calls": 16, "bytes": 5300000000}
    assert (row["host_cpu_per_token_s"], row["device_time_per_token_s"]) == (0.011, 0.005)
    assert (row["work_status"], row["work_message"]) == ("ok", "the same work")
    assert (row["device_time_status"], row["device_time_change"]) == ("ok", 0.01)
    assert row["baseline_runs_needed"] == 0
    junit = dict(junit_properties(record))
    assert json.loads(junit["distperf_work"]) == WORK.to_json()  # a JUnit property is text
    assert junit["distperf_host_cpu_per_token_s"] == 0.011
    assert extra_info(record)["work"] == WORK.to_json()
    assert " AG 16x 5.3GB " in format_result_line(record, "passed")
    result = _result()
    uncounted = (replace(result.ranks[0], work=None), result.ranks[1])
    record = _record(RunResult(result.spec, uncounted, 2.0, 0.0))
    assert record.to_dict()["work"] is None
    assert "distperf_work" not in dict(junit_properties(record))
    assert " compute       -                 25.50" in format_result_line(record, "passed")
