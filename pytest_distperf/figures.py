"""Every figure of a run, declared once: name, unit, how it is reduced from the ranks' results,
and which reports show it (reductions.py says what each part means; docs/extending.md, "Adding
a figure"). The outputs (judge/record.py, output/*.py) go through `declared(...)` in the order
of `RUN_FIGURES` and name no figure themselves; a run's figure is also an attribute of its
`RunResult`, reduced as declared here.

A figure's `name` is its key in the JSON report (--distperf-json) and in `RunResult.summary()`,
its pytest-benchmark `extra_info` key, and its JUnit property after "distperf_" (unless
`junit_as` renames it). Its value is None where the run has no such figure (no ttft for a
user's own generation loop): the JSON row says null, the table "-", and JUnit and
`extra_info` leave it out. `ABSENT` (a check that did not run) leaves the JSON key out too.
Pure: no torch, no pytest; a reduction reads the RunResult or the judged record by attribute.
"""

from __future__ import annotations

from typing import Any

from pytest_distperf.jsonfields import NUMBER
from pytest_distperf.reductions import (
    ABSENT,
    BENCHMARK_EXTRA,
    JUNIT,
    MARKDOWN,
    REPORT_JSON,
    SCALAR,
    TABLE,
    Figure,
    JUnitName,
    MarkdownColumn,
    Reduction,
    Report,
    Source,
    TableColumn,
    any_rank,
    each_rank,
    every_rank,
    first_rank,
    from_result,
    from_spec,
    json_value,
    judged,
    slowest_known_rank,
    slowest_phases,
    slowest_rank,
)
from pytest_distperf.work import busiest, work_cell


def _check_outcomes(check: str) -> tuple[Figure, Figure]:
    # A check that did not run leaves no trace: readers take a missing status for "not judged".
    status, message = judged(f"ran.{check}.status"), judged(f"ran.{check}.message")
    return (
        Figure(f"{check}_status", "", status, f"how the {check} check came out"),
        Figure(f"{check}_message", "", message, f"what the {check} check says"),
    )


def _verdict_cell(record: Any, outcome: str) -> Any:
    # The table says how the test came out: a run whose test failed otherwise may read "ok".
    return record.value("verdict") if outcome == "passed" else "FAILED"


def _ranks_cell(record: Any, outcome: str) -> str:
    return f"{record.value('devices')} x {record.value('accelerator')}"


def _matmul_source(run: Any) -> str | None:
    return run.ranks[0].matmul_source if run.spec.workload.training else None


def _work_cell(record: Any, outcome: str) -> str | None:
    work = record.value("work")
    return None if work is None else work_cell(work)


# The gate's checks, as judge/checks.py names them (CHECK_NAMES; a test holds the two equal).
_CHECKS = ("threshold", "baseline", "relative_speed", "memory", "work", "device_time", "loss")
_S = "slowest rank per repeat"


# In order: the JUnit properties and pytest-benchmark's extra_info keep this order.
# fmt: off
RUN_FIGURES: tuple[Figure, ...] = (
    Figure("test_id", "", from_spec("test_id"), "the test's node id",
           REPORT_JSON | MARKDOWN | TABLE, TableColumn("test", 140),
           MarkdownColumn("Test", 0, "code"), json_type=str),
    Figure("tokens_per_sec", "tok/s", from_result("tokens_per_sec", f"median of repeats, {_S}"),
           "new tokens of one rank's generation over its wall time, prefill included; "
           "training: one step's tokens over every data-parallel replica over its time",
           SCALAR | MARKDOWN | TABLE, TableColumn("tok/s", 10, "10.2f"),
           MarkdownColumn("tok/s", 30, "rate"), json_type=NUMBER),
    Figure("decode_tokens_per_sec", "tok/s",
           from_result("decode_tokens_per_sec", f"median of repeats, {_S}"),
           "decode steps' tokens over decode time, prefill left out", SCALAR | TABLE,
           TableColumn("decode", 20, "9.2f")),
    Figure("strategy", "", from_spec("strategy"), "the parallel strategy",
           SCALAR | MARKDOWN | TABLE, TableColumn("strategy", 40, "<15"),
           MarkdownColumn("Strategy", 10, "text"), json_type=str),
    Figure("devices", "ranks", from_spec("devices"), "ranks (devices) the run used",
           SCALAR | MARKDOWN | TABLE,
           TableColumn("ranks", 50, "<9", cell=_ranks_cell),
           MarkdownColumn("Devices", 20, "count"), json_type=int),
    Figure("accelerator", "", from_spec("accelerator"), '"cpu" or "cuda"', SCALAR | MARKDOWN,
           json_type=str),
    Figure("topology_key", "", judged("topology_key"), "the machine's topology: baselines' key",
           SCALAR | MARKDOWN, json_type=str),
    Figure("predicted_tokens_per_sec", "tok/s", judged("threshold.predicted_tokens_per_sec"),
           "the modelled, links-aware rate the threshold judges by", SCALAR | TABLE,
           TableColumn("predicted", 60, "9.2f"), json_type=NUMBER),
    Figure("threshold_tokens_per_sec", "tok/s", judged("threshold.threshold_tokens_per_sec"),
           "the rate the run must reach: efficiency x predicted", SCALAR, json_type=NUMBER),
    Figure("bound", "", judged("threshold.bound"), "the term that bounds the predicted rate",
           SCALAR | TABLE, TableColumn("bound", 70, "<13"), json_type=str),
    Figure("baseline_tokens_per_sec", "tok/s", judged("baseline.baseline_tokens_per_sec"),
           "the recorded baseline's level", SCALAR | MARKDOWN | TABLE,
           TableColumn("baseline", 80, "9.2f"), MarkdownColumn("Baseline tok/s", 40, "rate"),
           json_type=NUMBER),
    Figure("change", "", judged("baseline.change"), "tok/s / baseline - 1",
           SCALAR | MARKDOWN | TABLE, TableColumn("change", 90, "+7.1%"),
           MarkdownColumn("Change", 50, "change"), json_type=NUMBER),
    Figure("tolerance", "", judged("baseline.tolerance"), "the drop the baseline check allows",
           SCALAR),
    Figure("detectable_drop", "", judged("detectable.detectable_drop"),
           "the smallest drop the baseline check catches", SCALAR | TABLE,
           TableColumn("detect", 100, "6.0%")),
    Figure("relative_speed", "", from_result("relative_speed", f"median of repeats, {_S}"),
           "the bare model's generation time over the wrapped one's", SCALAR | MARKDOWN,
           markdown=MarkdownColumn("Relative speed", 60, "ratio"), json_type=NUMBER),
    Figure("relative_speed_change", "", judged("relative_speed.change"),
           "relative speed / its baseline - 1", SCALAR | MARKDOWN | TABLE,
           TableColumn("rel.chg", 110, "+7.1%"), MarkdownColumn("Rel. change", 70, "change"),
           json_type=NUMBER),
    Figure("relative_speed_detectable_drop", "", judged("relative_speed.detectable_drop"),
           "the smallest relative-speed drop caught", SCALAR | TABLE,
           TableColumn("detect", 120, "6.0%")),
    Figure("verdict", "", judged("decision.verdict"), "the worst outcome of any check",
           SCALAR | MARKDOWN | TABLE,
           TableColumn("verdict", 130, "<18", sep="  ", cell=_verdict_cell),
           MarkdownColumn("Verdict", 80, "verdict"), json_type=str),
    Figure("peak_memory_bytes", "bytes", slowest_rank("peak_memory_bytes", "max over ranks"),
           "peak memory of the busiest rank", SCALAR),
    Figure("tokens_per_sec_samples", "tok/s", from_result("tokens_per_sec_samples", _S),
           "tokens_per_sec of each repeat", REPORT_JSON | BENCHMARK_EXTRA),
    Figure("aggregate_tokens_per_sec", "tok/s",
           from_result("aggregate_tokens_per_sec", "replicas x tokens_per_sec"),
           "every independent stream's tokens", REPORT_JSON | BENCHMARK_EXTRA),
    Figure("ttft_s", "s", from_result("ttft_s", f"median of repeats, {_S}"),
           "time to the first new token (prefill)", SCALAR | TABLE,
           TableColumn("ttft ms", 30, "8.1f", scale=1000), junit_as=JUnitName("ttft_ms", 1000)),
    Figure("work", "", slowest_rank("work", "max over ranks, counter by counter", busiest),
           "the counted generation's collectives, ops, FLOPs and kernels per decode token and "
           "per prefill", REPORT_JSON | JUNIT | BENCHMARK_EXTRA | TABLE,
           TableColumn("work", 75, "<13", cell=_work_cell)),
    Figure("host_cpu_per_token_s", "s", slowest_rank("host_cpu_per_token_s"),
           "process CPU time over the timed repeats per new token", SCALAR),
    Figure("run_queue_wait_per_token_s", "s", slowest_rank("run_queue_wait_per_token_s"),
           "time a rank's threads waited for a core over the timed repeats, per new token "
           "(Linux run-queue delay): what another process took", SCALAR),
    Figure("steal_per_token_s", "s", slowest_rank("steal_per_token_s"),
           "the host's steal time per CPU over the timed repeats, per new token (/proc/stat): "
           "what a VM's hypervisor gave another guest"),
    Figure("phase_s", "s", slowest_rank("phase_s", largest=slowest_phases),
           "seconds of each phase of the test (join, calibrate, build, reference, wrap, compile, "
           "warmup, timed, bare, measure, count, result)"),
    Figure("off_cpu_share", "", from_result("off_cpu_share", "the rank that waited most"),
           "share of a timed repeat a rank's timing thread was off the CPU by its own doing"),
    Figure("device_time_per_token_s", "s", slowest_rank("device_time_per_token_s"),
           "summed kernel time per decode token of the counted generation (CUDA)", SCALAR),
    Figure("mode", "", Reduction("as asked", Source.RUN, lambda r: r.spec.workload.mode),
           '"generate" or "train"', SCALAR, json_type=str),
    Figure("step_time_s", "s", from_result("step_time_s", f"median of repeats, {_S}"),
           "training: one optimizer step (forward, backward, AdamW)", SCALAR),
    Figure("mfu", "", from_result("mfu", "model FLOPs per second / summed matmul rate"),
           "training: model FLOPs utilisation against the ranks' measured matmul rate",
           SCALAR),
    Figure("loss", "", first_rank("loss"),
           "training: the first step's loss on data-parallel rank 0's batch", SCALAR),
    Figure("reference_loss", "", first_rank("reference_loss"),
           "training: the same weights' and batch's loss in one process, before wrapping"),
    Figure("reference_step_s", "s", slowest_rank("reference_step_s"),
           "training: the whole model's step alone, before wrapping"),
    Figure("model_flops_per_step", "FLOP",
           from_result("model_flops_per_step", "replicas x one rank's batch"),
           "training: 6 x parameters x tokens + attention, over every replica",
           REPORT_JSON | BENCHMARK_EXTRA),
    Figure("peak_flops", "FLOP/s", from_result("peak_flops", "sum over ranks"),
           "training: MFU's denominator, the ranks' measured matmul rates",
           REPORT_JSON | BENCHMARK_EXTRA),
    Figure("peak_flops_source", "", Reduction("rank 0's", Source.RUN, _matmul_source),
           "training: how that rate was measured", REPORT_JSON | BENCHMARK_EXTRA),
    Figure("workload", "", from_spec("workload"), "the distperf marker's workload",
           REPORT_JSON | BENCHMARK_EXTRA),
    Figure("implementation", "", first_rank("implementation"),
           "what actually ran: Fabric strategy, sharding, backend, wrapper",
           REPORT_JSON | BENCHMARK_EXTRA),
    Figure("device_name", "", first_rank("device_name"), "the device's name",
           REPORT_JSON | BENCHMARK_EXTRA | MARKDOWN, json_type=str),
    Figure("bound_description", "", judged("threshold.bound_description"),
           "the bound in words", REPORT_JSON | BENCHMARK_EXTRA),
    Figure("link_class", "", judged("threshold.link_class"), "the links the prediction used",
           REPORT_JSON | BENCHMARK_EXTRA),
    Figure("new_tokens_per_generation", "tokens", from_result("new_tokens", "as asked"),
           "max_new_tokens x batch_size", BENCHMARK_EXTRA),
    # the JSON report's alone
    Figure("repeats", "", from_spec("repeats"), "timed generations"),
    Figure("warmup", "", from_spec("warmup"), "untimed generations before them"),
    Figure("nodes", "", from_spec("nodes"),
           "hosts the ranks ran on"),
    Figure("peak_memory_per_rank", "bytes", each_rank("peak_memory_bytes"), "each rank's peak"),
    Figure("memory_kind", "", first_rank("memory_kind"), "what the peak measures"),
    Figure("versions", "", first_rank("versions"), "package versions in the ranks"),
    Figure("launch_s", "s", from_result("launch_s", "the launcher's"), "process start to exit"),
    Figure("startup_s", "s", from_result("startup_s", "slowest rank"),
           "launch to the first timed token"),
    Figure("reference_token_s", "s", slowest_known_rank("reference_token_s"),
           "per-token time of the whole model alone"),
    Figure("reference_source", "", first_rank("reference_source"),
           "how the reference (reference_token_s, reference_step_s) was obtained"),
    Figure("relative_speed_samples", "", from_result("relative_speed_samples", _S),
           "relative_speed of each repeat"),
    Figure("host_loop_samples", "s", from_result("host_loop_samples", _S),
           "the host-speed loop beside each repeat"),
    Figure("host_loop_cpu_samples", "s", from_result("host_loop_cpu_samples", _S),
           "that loop's CPU time: its core's own speed, without waits for a core"),
    Figure("work_s", "s", slowest_rank("work_s"), "a rank's time on the test"),
    Figure("harness_s", "s", from_result("harness_s", "launch_s - work_s"),
           "what the launch cost beyond the test"),
    Figure("compile_s", "s", slowest_known_rank("compile_s"), "compiling the step"),
    Figure("count_s", "s", slowest_rank("count_s"),
           "the counted generation after the timed ones"),
    Figure("compiled", "", first_rank("compiled"), 'how the step was compiled; "" eager'),
    Figure("cuda_graphs", "", every_rank("cuda_graphs"),
           "the timed steps replayed as CUDA graphs"),
    Figure("graph_breaks", "", any_rank("graph_breaks"),
           "steps compiled around the wrapper's hooks"),
    Figure("bandwidth_utilization", "", judged("bandwidth_utilization"),
           "weights read per second over the measured copy bandwidth"),
    Figure("efficiency", "", judged("threshold.efficiency"), "threshold / predicted"),
    Figure("ratio_to_predicted", "", judged("threshold.ratio_to_predicted"), "tok/s / predicted"),
    Figure("tolerance_runs", "runs", judged("baseline.tolerance_runs"),
           "recorded runs whose spread set the tolerance"),
    Figure("baseline_runs_needed", "runs", judged("baseline.runs_needed"),
           "recorded runs the baseline still needs before its tolerance is theirs"),
    Figure("p_value", "", judged("baseline.p_value"), "the baseline comparison's p-value"),
    Figure("baseline_verdict", "", judged("baseline.verdict"), "the comparison's verdict"),
    Figure("baseline_recorded_at", "", judged("baseline.recorded_at"), "when it was recorded"),
    Figure("baseline_commit", "", judged("baseline.commit"), "the commit it was recorded at"),
    Figure("relative_speed_baseline", "", judged("relative_speed.baseline"),
           "the recorded relative speed"),
    Figure("relative_speed_tolerance", "", judged("relative_speed.tolerance"), "its tolerance"),
    Figure("relative_speed_p_value", "", judged("relative_speed.p_value"), "its p-value"),
    Figure("relative_speed_verdict", "", judged("relative_speed.verdict"), "its verdict"),
    Figure("busy_evidence", "", judged("decision.busy_evidence"),
           "what something outside the ranks measurably took per token beyond the baseline's "
           "run: run-queue wait, steal, the core's slowdown (null: not measured)"),
    Figure("off_cpu_share_change", "", judged("baseline.waits.rise"),
           "off_cpu_share - the recorded runs' (judge/waits.py)"),
    Figure("device_time_change", "", judged("ran.device_time.figures.change"),
           "device time per token / its recorded runs' - 1"),
    *(outcome for check in _CHECKS for outcome in _check_outcomes(check)),
    Figure("baseline_recorded", "", judged("baseline_recorded"), "this run became the baseline"),
    Figure("prediction", "", judged("prediction"), "the performance model's prediction"),
    Figure("calibration", "", judged("calibration"), "the session's link calibration"),
    Figure("session_to_first_timed_s", "s", judged("session_to_first_timed_s"),
           "pytest start to this run's first timed token"),
)
# fmt: on


def declared(report: Report | None = None, source: Source | None = None) -> tuple[Figure, ...]:
    """The declared figures, in order, that `report` shows and `source` computes (None: any).
    Read at call time, so a figure added to RUN_FIGURES (a test's monkeypatch) counts."""
    return tuple(
        f
        for f in RUN_FIGURES
        if (report is None or f.reports & report) and (source is None or f.source is source)
    )


def figure(name: str) -> Figure:
    """The declared figure of that name; KeyError when there is none."""
    for declared_figure in RUN_FIGURES:
        if declared_figure.name == name:
            return declared_figure
    raise KeyError(f"no declared figure {name!r}")


def run_row(result: Any) -> dict[str, Any]:
    """The JSON row of a RunResult's own figures (`RunResult.summary()`)."""
    row = {}
    for declared_figure in declared(REPORT_JSON, Source.RUN):
        value = declared_figure.reduce.compute(result)
        if value is not ABSENT:
            row[declared_figure.name] = json_value(value)
    return row
