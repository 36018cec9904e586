"""The session's own renderings of judged runs, each read from the run's JSON row
(`JudgedRun.to_dict`): the JSON report, the JUnit properties and the terminal table (with `-v`,
each test's phases beneath its row)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.store.store import atomic_write_text
from pytest_distperf.work import Work, work_cell

REPORT_SCHEMA = 1

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
    """Write every run's row atomically: a reader never sees half a report. `extra`: the
    session's own fields (``baseline_orphans``), present only when there is something to say."""
    rows = [record.to_dict() for record in records]
    document = {**(extra or {}), "schema": REPORT_SCHEMA, "results": rows}
    text = json.dumps(document, indent=2, sort_keys=True)
    return atomic_write_text(path, text + "\n")


def junit_properties(record: JudgedRun) -> list[tuple[str, Any]]:
    """(name, value) pairs for the test report's `user_properties` (JUnit XML), in the order of
    SCALARS, then ttft in ms, then COUNTED; a figure without a value is left out, a record is
    written as JSON text."""
    row = record.to_dict()
    ttft_s = row["ttft_s"]
    row["ttft_ms"] = None if ttft_s is None else ttft_s * 1000
    named = [(name, row.get(name)) for name in (*SCALARS, "ttft_ms", *COUNTED)]
    return [(f"distperf_{name}", _text(value)) for name, value in named if value is not None]


def _text(value: Any) -> Any:
    if isinstance(value, dict | list):  # a JUnit property holds text
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return value


@dataclass(frozen=True)
class Column:
    """A column of the terminal table: its header, the format of its values and which value of
    a row (`JudgedRun.to_dict`) it shows; None shows as "-"."""

    header: str
    spec: str  # format spec: "<" for left-aligned, width, precision
    value: Callable[[Mapping[str, Any], str], Any]  # (row, the test's outcome) -> value
    sep: str = " "  # text before the column

    @property
    def width(self) -> int:
        return int("".join(c for c in self.spec.split(".")[0] if c.isdigit()) or 0)

    def heading(self) -> str:
        return format(self.header, ("<" if self.spec.startswith("<") else ">") + str(self.width))

    def text(self, row: Mapping[str, Any], outcome: str) -> str:
        value = self.value(row, outcome)
        if value is None:
            return "-".ljust(self.width) if self.spec.startswith("<") else "-".rjust(self.width)
        return format(value, self.spec)


def _figure(name: str, scale: float = 1.0) -> Callable[[Mapping[str, Any], str], Any]:
    def value(row: Mapping[str, Any], outcome: str) -> Any:
        figure = row.get(name)
        return figure if figure is None or scale == 1 else figure * scale

    return value


def _work(row: Mapping[str, Any], outcome: str) -> str | None:
    work = row["work"]
    return None if work is None else work_cell(Work.from_json(work, "work"))


def _verdict(row: Mapping[str, Any], outcome: str) -> str:
    # How the test came out: a run whose test failed otherwise may read "ok".
    return row["verdict"] if outcome == "passed" else "FAILED"


TABLE = (
    Column("tok/s", "10.2f", _figure("tokens_per_sec")),
    Column("decode", "9.2f", _figure("decode_tokens_per_sec")),
    Column("ttft ms", "8.1f", _figure("ttft_s", 1000)),
    Column("strategy", "<15", _figure("strategy")),
    Column("ranks", "<9", lambda row, _: f"{row['devices']} x {row['accelerator']}"),
    Column("predicted", "9.2f", _figure("predicted_tokens_per_sec")),
    Column("bound", "<13", _figure("bound")),
    Column("work", "<13", _work),
    Column("baseline", "9.2f", _figure("baseline_tokens_per_sec")),
    Column("change", "+7.1%", _figure("change")),
    Column("detect", "6.0%", _figure("detectable_drop")),
    Column("rel.chg", "+7.1%", _figure("relative_speed_change")),
    Column("detect", "6.0%", _figure("relative_speed_detectable_drop")),
    Column("verdict", "<18", _verdict, sep="  "),
    Column("test", "", _figure("test_id")),
)


def result_header() -> str:
    return "".join(column.sep + column.heading() for column in TABLE)[1:]


def format_result_line(record: JudgedRun, outcome: str) -> str:
    """One row of the table under `result_header()`; `outcome` is the test's ("passed", ...).
    A figure the run does not have (no prediction, no baseline yet) shows as "-"."""
    row = record.to_dict()
    return "".join(column.sep + column.text(row, outcome) for column in TABLE)[1:]


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
