"""The run's figures, declared once (pytest_distperf/figures.py), and every output that reads
the declaration: the JSON report, `RunResult.summary()`, the JUnit properties, pytest-benchmark's
`extra_info`, the terminal table and the Markdown summary."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_distperf import figures, reductions
from pytest_distperf.figures import (
    BENCHMARK_EXTRA,
    JUNIT,
    MARKDOWN,
    REPORT_JSON,
    TABLE,
    Figure,
    JUnitName,
    MarkdownColumn,
    Reduction,
    Source,
    TableColumn,
    declared,
)
from pytest_distperf.jsonfields import NUMBER
from pytest_distperf.judge.checks import (
    CHECK_NAMES,
    BaselineFigures,
    BusyEvidence,
    BusyFigures,
    Check,
    CheckStatus,
    Decision,
    DeviceTimeFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
    WaitFigures,
    WorkFigures,
)
from pytest_distperf.judge.record import JudgedRun, RunFigures
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.output import markdown
from pytest_distperf.output.benchmark_session import extra_info
from pytest_distperf.output.markdown import SummaryRow, parse_report, render_markdown
from pytest_distperf.output.report import (
    RESULT_HEADER,
    format_result_line,
    result_header,
    write_json_report,
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
    }
)
# The keys of `RunResult.summary()`, the unjudged run's row.
SUMMARY_KEYS = frozenset(
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
    return RunResult(spec=spec, ranks=ranks, launch_s=2.0, launched_at=0.0)


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
    busy=BusyFigures(BusyEvidence(0.001, None, None), 0.3, -0.3),
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
        work=Check("work", CheckStatus.OK, "the same work", WorkFigures(0.01, (), ())),
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
    row = _record().to_json()
    assert set(row) == JSON_KEYS
    assert json.loads(json.dumps(row)) == row


def test_the_summary_keeps_every_key() -> None:
    assert set(_result().summary()) >= SUMMARY_KEYS


def test_junit_properties_keep_their_names_and_order() -> None:
    properties = _record().junit_properties()
    assert tuple(name for name, _ in properties) == JUNIT_NAMES
    assert dict(properties)["distperf_ttft_ms"] == pytest.approx(10.0)


def test_benchmark_extra_info_keeps_its_keys_and_order() -> None:
    assert tuple(extra_info(_record())) == BENCHMARK_EXTRA_KEYS


def test_the_table_header_is_unchanged() -> None:
    assert RESULT_HEADER == RESULT_HEADER_TEXT


# --- the declaration --------------------------------------------------------------------------


def test_the_declaration_is_consistent() -> None:
    names = [f.name for f in figures.RUN_FIGURES]
    assert len(names) == len(set(names))
    # a figure is an attribute of RunFigures and SummaryRow: no name may hide a method
    taken = set(dir(RunFigures)) | {"figures", "messages"}
    assert all(name.isidentifier() and name not in taken for name in names)
    assert figures._CHECKS == CHECK_NAMES
    for report, column in ((TABLE, "table"), (MARKDOWN, "markdown")):
        positions = [getattr(f, column).at for f in declared(report) if getattr(f, column)]
        assert len(positions) == len(set(positions)), column
    for f in declared(MARKDOWN):  # read back from saved reports
        assert f.json_type is not None, f.name
        assert f.markdown is None or f.markdown.style in reductions.MARKDOWN_STYLES
    assert set(reductions.MARKDOWN_STYLES) == set(markdown._STYLES)
    assert all(f.unit is not None and f.description for f in figures.RUN_FIGURES)


def test_a_declaration_that_contradicts_itself_is_refused() -> None:
    reduce = figures.from_spec("repeats")
    with pytest.raises(ValueError, match="a table column goes with Report.TABLE"):
        Figure("x", "", reduce, "x", REPORT_JSON | TABLE)
    with pytest.raises(ValueError, match="a table column goes with Report.TABLE"):
        Figure("x", "", reduce, "x", REPORT_JSON, table=TableColumn("x", 1))
    with pytest.raises(ValueError, match="needs Report.MARKDOWN"):
        Figure("x", "", reduce, "x", markdown=MarkdownColumn("x", 1, "text"))
    with pytest.raises(ValueError, match="junit_as needs Report.JUNIT"):
        Figure("x", "", reduce, "x", junit_as=JUnitName("y"))


# A generation's record has no training figures: JUnit and extra_info leave out what is None,
# and the JSON row a check that did not run.
TRAIN_ONLY = {"step_time_s", "mfu", "loss", "model_flops_per_step", "peak_flops"}
NO_LOSS_CHECK = {"loss_status", "loss_message"}


def test_each_output_shows_exactly_the_figures_declared_for_it() -> None:
    record = _record()
    assert set(record.to_json()) == {f.name for f in declared(REPORT_JSON)} - NO_LOSS_CHECK
    run_json = {f.name for f in declared(REPORT_JSON, Source.RUN)}
    assert set(_result().summary()) == run_json
    junit = [f.junit_name for f in declared(JUNIT) if f.name not in TRAIN_ONLY]
    assert [n for n, _ in record.junit_properties()] == junit
    extra = [
        f.name
        for f in declared(BENCHMARK_EXTRA)
        if f.name not in {*TRAIN_ONLY, "peak_flops_source"}
    ]
    assert list(extra_info(record)) == extra
    header = result_header()
    for f in figures.RUN_FIGURES:
        assert (f.table is not None and f.table.header in header) == bool(f.reports & TABLE)
    row = SummaryRow.of(record)
    assert set(row.figures) == {f.name for f in declared(MARKDOWN)}
    table_head = render_markdown([record]).splitlines()[4]
    assert table_head == "| " + " | ".join(c.header for c in _markdown_columns()) + " |"


def _markdown_columns() -> list[MarkdownColumn]:
    columns = [f.markdown for f in declared(MARKDOWN) if f.markdown is not None]
    return sorted(columns, key=lambda c: c.at)


def test_a_figure_none_for_this_run_is_null_in_json_and_left_out_elsewhere() -> None:
    result = _result()
    result = replace(
        result,
        ranks=tuple(replace(r, samples=(Sample(1.0, None, None),) * 2) for r in result.ranks),
    )
    record = _record(result)
    assert record.to_json()["ttft_s"] is None and record.to_json()["decode_tokens_per_sec"] is None
    assert "distperf_ttft_ms" not in dict(record.junit_properties())
    assert "ttft_s" not in extra_info(record)
    assert "        -" in format_result_line(record, "passed")  # ttft and decode: "-"


def test_reductions_over_ranks() -> None:
    result = _result()
    assert figures.first_rank("device_name").compute(result) == "gpu"
    assert figures.each_rank("peak_memory_bytes").compute(result) == (1000, 1001)
    assert figures.slowest_rank("peak_memory_bytes").compute(result) == 1001
    assert figures.slowest_rank("compile_s").compute(result) is None  # no rank reports one
    one = replace(result, ranks=(replace(result.ranks[0], compile_s=2.0), *result.ranks[1:]))
    assert figures.slowest_rank("compile_s").compute(one) is None  # the other may be slowest
    # The whole model timed alone (or compiling it): any rank's stands for the run's.
    assert figures.slowest_known_rank("compile_s").compute(one) == 2.0
    one = replace(one, ranks=(replace(one.ranks[0], reference_token_s=0.002), *one.ranks[1:]))
    assert one.reference_token_s == 0.002 and one.compile_s == 2.0
    assert result.peak_memory_bytes == 1001  # a declared figure is the run's attribute
    assert figures.judged("baseline.busy.explained_share").compute(_record()) == 0.3
    assert figures.judged("prediction.bound").compute(_record()) is figures.ABSENT


def test_json_values_are_plain() -> None:
    value = {"counts": (1, 2), "kind": CheckStatus.OK, "what": Implementation("a", "b", "c", "d")}
    assert figures.json_value(value) == {
        "counts": [1, 2],
        "kind": "ok",
        "what": {"fabric_strategy": "a", "sharding": "b", "backend": "c", "wrapper": "d"},
    }


def test_run_figures_are_read_only_and_travel_to_the_xdist_controller() -> None:
    record = _record()
    with pytest.raises(AttributeError, match="read-only"):
        record.run.tokens_per_sec = 1.0  # type: ignore[misc]
    with pytest.raises(AttributeError, match="no figure 'util'"):
        _ = record.run.util
    payload = detach(_attached(record))
    assert isinstance(payload, Payload)
    assert payload.records[0].to_json() == record.to_json()
    assert payload.records[0].run == record.run


def _attached(record: JudgedRun) -> pytest.TestReport:
    report = pytest.TestReport("t", ("t.py", 1, "t"), {}, "passed", None, "call")
    attach(report, Payload((record,), None))
    return report


# --- adding a figure ----------------------------------------------------------------------------


def _counts(result: RunResult) -> object:
    # nested per-token counts, which only some runs have (None otherwise)
    return None if result.spec.strategy == "ddp" else {"flops": {"matmul": 2.5e6}, "bytes": 4096}


ADDED = (
    Figure("answer", "", Reduction("always", Source.RUN, lambda _: 42), "a test's figure",
           REPORT_JSON | JUNIT | BENCHMARK_EXTRA),
    Figure("counts", "", Reduction("rank 0's", Source.RUN, _counts), "counts per token",
           REPORT_JSON | BENCHMARK_EXTRA),
    Figure("util", "", Reduction("of the run", Source.RUN, lambda _: 0.25), "a utilisation",
           REPORT_JSON | MARKDOWN | TABLE, TableColumn("util", 125, "5.2f"),
           MarkdownColumn("Util", 75, "ratio"), json_type=NUMBER),
    Figure("predicted_ms", "ms", figures.judged("threshold.predicted_tokens_per_sec"),
           "the gate's figure", JUNIT, junit_as=JUnitName("predicted_x2", 2.0)),
)  # fmt: skip


def test_an_added_figure_reaches_every_output_it_is_declared_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(figures, "RUN_FIGURES", (*figures.RUN_FIGURES, *ADDED))
    record = _record()
    row = record.to_json()
    assert (row["answer"], row["counts"], row["util"]) == (
        42,
        ADDED[1].reduce.compute(_result()),
        0.25,
    )
    assert "predicted_ms" not in row
    assert _result().summary()["counts"] == {"flops": {"matmul": 2.5e6}, "bytes": 4096}
    junit = record.junit_properties()
    assert junit[-2:] == [("distperf_answer", 42), ("distperf_predicted_x2", 80.0)]
    assert [n for n, _ in junit[:-2]] == list(JUNIT_NAMES)
    extra = extra_info(record)
    assert (extra["answer"], extra["counts"]["bytes"]) == (42, 4096) and "util" not in extra
    assert "rel.chg detect  util  verdict" in result_header()
    assert " 0.25  FAIL (baseline)" in format_result_line(record, "passed")
    text = render_markdown([record])
    assert "| Rel. change | Util | Verdict |" in text and "| 0.250 |" in text
    saved = parse_report(json.loads(write_json_report(tmp_path / "r.json", [record]).read_text()))
    assert render_markdown(saved) == text

    ddp = _record(replace(_result(), spec=replace(_result().spec, strategy="ddp")))
    assert ddp.to_json()["counts"] is None and "counts" not in extra_info(ddp)


def test_the_counted_work_and_its_check_reach_every_output() -> None:
    record = _record()
    row = record.to_json()
    assert row["work"] == WORK.to_json()
    assert row["work"]["decode"]["collectives"]["all_gather"] == {"calls": 16, "bytes": 5300000000}
    assert (row["host_cpu_per_token_s"], row["device_time_per_token_s"]) == (0.011, 0.005)
    assert (row["work_status"], row["work_message"]) == ("ok", "the same work")
    assert (row["device_time_status"], row["device_time_change"]) == ("ok", 0.01)
    assert row["baseline_runs_needed"] == 0
    junit = dict(record.junit_properties())
    assert json.loads(junit["distperf_work"]) == WORK.to_json()  # a JUnit property is text
    assert junit["distperf_host_cpu_per_token_s"] == 0.011
    assert extra_info(record)["work"] == WORK.to_json()
    assert " AG 16x 5.3GB " in format_result_line(record, "passed")
    uncounted = _result()
    uncounted = replace(
        uncounted, ranks=(replace(uncounted.ranks[0], work=None), uncounted.ranks[1])
    )
    record = _record(uncounted)
    assert record.to_json()["work"] is None and "distperf_work" not in dict(
        record.junit_properties()
    )
    assert " compute       -                 25.50" in format_result_line(record, "passed")
