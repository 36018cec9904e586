"""The session's own renderings of judged runs, each read from the run's JSON row
(`JudgedRun.to_dict`): the JSON report, the JUnit properties and the terminal table (with `-v`,
each test's phases beneath its row)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.output.markdown import REPORT_SCHEMA
from pytest_distperf.store.store import atomic_write_text
from pytest_distperf.work import Work, work_cell

# The figures CI scripts and saved benchmarks read (JUnit and pytest-benchmark's extra_info), in
# the order they keep; a JUnit property is `distperf_<name>`.
SCALARS = (
    *("tokens_per_sec", "decode_tokens_per_sec", "strategy", "devices", "accelerator"),
    *("topology_key", "predicted_tokens_per_sec", "threshold_tokens_per_sec", "bound"),
    *("baseline_tokens_per_sec", "change", "tolerance", "detectable_drop", "relative_speed"),
    *("relative_speed_change", "relative_speed_detectable_drop", "verdict", "peak_memory_bytes"),
)
COUNTED = (
    *("work", "host_cpu_per_token_s", "run_queue_wait_per_token_s", "device_time_per_token_s"),
    *("mode", "step_time_s", "mfu", "loss"),
)


def write_json_report(
    path: str | os.PathLike[str],
    records: Sequence[JudgedRun],
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Every run's row, atomically; `extra`: the session's own fields (``baseline_orphans``)."""
    rows = [record.to_dict() for record in records]
    document = {**(extra or {}), "schema": REPORT_SCHEMA, "results": rows}
    return atomic_write_text(path, json.dumps(document, indent=2, sort_keys=True) + "\n")


def junit_properties(record: JudgedRun) -> list[tuple[str, Any]]:
    """`user_properties` (JUnit XML) in the order of SCALARS, ttft in ms, COUNTED; a figure
    without a value left out, a record as JSON text."""
    row = record.to_dict()
    ttft_s = row["ttft_s"]
    row["ttft_ms"] = None if ttft_s is None else ttft_s * 1000
    properties = []
    for name in (*SCALARS, "ttft_ms", *COUNTED):
        value = row.get(name)
        if isinstance(value, dict | list):  # a JUnit property holds text
            value = json.dumps(value, sort_keys=True, separators=(",", ":"))
        if value is not None:
            properties.append((f"distperf_{name}", value))
    return properties


def _figure(name: str, scale: float = 1.0) -> Callable[[Mapping[str, Any]], Any]:
    def value(row: Mapping[str, Any]) -> Any:
        figure = row.get(name)
        return figure if figure is None or scale == 1 else figure * scale

    return value


def _work(row: Mapping[str, Any]) -> str | None:
    work = row["work"]
    return None if work is None else work_cell(Work.from_json(work, "work"))


# The terminal table's columns: header, format spec (its digits the width), value of a row
# (`JudgedRun.to_dict`), text before it. The verdict column is the test's outcome's.
TABLE: tuple[tuple[str, str, Callable[[Mapping[str, Any]], Any], str], ...] = (
    ("tok/s", "10.2f", _figure("tokens_per_sec"), " "),
    ("decode", "9.2f", _figure("decode_tokens_per_sec"), " "),
    ("ttft ms", "8.1f", _figure("ttft_s", 1000), " "),
    ("strategy", "<15", _figure("strategy"), " "),
    ("ranks", "<9", lambda row: f"{row['devices']} x {row['accelerator']}", " "),
    ("predicted", "9.2f", _figure("predicted_tokens_per_sec"), " "),
    ("bound", "<13", _figure("bound"), " "),
    ("work", "<13", _work, " "),
    ("baseline", "9.2f", _figure("baseline_tokens_per_sec"), " "),
    ("change", "+7.1%", _figure("change"), " "),
    ("detect", "6.0%", _figure("detectable_drop"), " "),
    ("rel.chg", "+7.1%", _figure("relative_speed_change"), " "),
    ("detect", "6.0%", _figure("relative_speed_detectable_drop"), " "),
    ("verdict", "<18", _figure("verdict"), "  "),
    ("test", "", _figure("test_id"), " "),
)


def _width(spec: str) -> str:
    return ("<" if spec.startswith("<") else ">") + "".join(filter(str.isdigit, spec.split(".")[0]))


def result_header() -> str:
    return "".join(sep + format(header, _width(spec)) for header, spec, _, sep in TABLE)[1:]


def format_result_line(record: JudgedRun, outcome: str) -> str:
    """One row of the table under `result_header()`; `outcome` is the test's ("passed", ...):
    a run whose test failed otherwise may read "ok". A figure the run lacks shows as "-"."""
    row = record.to_dict()
    if outcome != "passed":
        row["verdict"] = "FAILED"
    cells = []
    for _, spec, value, sep in TABLE:
        figure = value(row)
        cells.append(sep + (format("-", _width(spec)) if figure is None else format(figure, spec)))
    return "".join(cells)[1:]


def result_lines(
    records: Sequence[JudgedRun], outcomes: Mapping[str, str], verbose: bool
) -> list[str]:
    """The table: its header, a row per record and, verbose, each record's phases."""
    lines = [result_header()]
    for record in records:
        lines.append(format_result_line(record, outcomes[record.run.test_id]))
        if verbose and (phases := phase_line(record)):
            lines.append(phases)
    return lines


# The phases that only measure, beside the timed repeats: their share of those is their cost.
MEASURING = ("bare", "count")


def phase_line(record: JudgedRun) -> str:
    """Seconds of each phase, the slowest rank's, and what measuring beside the timed repeats
    cost against them; "" where the ranks reported no phases."""
    spent = record.run.phase_s
    if not spent:
        return ""
    parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in spent.items())
    timed, beside = spent.get("timed", 0.0), sum(spent.get(name, 0.0) for name in MEASURING)
    share = f"; bare + count = {beside / timed:.0%} of timed" if timed else ""
    return f"    phases, s: {parts}{share}"
