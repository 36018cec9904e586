"""The session's own renderings of judged runs: the JSON report and the terminal table (with
`-v`, each test's phases beneath its row)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_distperf.figures import TABLE, Figure, TableColumn, declared
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.store.files import atomic_write_text

REPORT_SCHEMA = 1


def write_json_report(path: str | os.PathLike[str], records: Sequence[JudgedRun]) -> Path:
    """Write every run's row atomically: a reader never sees half a report."""
    rows = [record.to_json() for record in records]
    text = json.dumps({"schema": REPORT_SCHEMA, "results": rows}, indent=2, sort_keys=True)
    return atomic_write_text(path, text + "\n")


def _line(text: Callable[[Figure, TableColumn], str]) -> str:
    """A line of the table: each figure declared with Report.TABLE, left to right, as `text`
    writes it after its column's separator (none before the first)."""
    shown = [(f, f.table) for f in declared(TABLE) if f.table is not None]
    shown.sort(key=lambda pair: pair[1].at)
    return "".join(column.sep + text(f, column) for f, column in shown)[len(shown[0][1].sep) :]


def result_header() -> str:
    return _line(lambda _, column: column.heading())


def format_result_line(record: JudgedRun, outcome: str) -> str:
    """One row of the table under `result_header()`; `outcome` is the test's ("passed", ...).

    A figure the run does not have (no prediction, no baseline yet) shows as "-"; one the
    record was not made with raises AttributeError.
    """

    def cell(f: Figure, column: TableColumn) -> str:
        return column.text(record.value(f) if column.cell is None else column.cell(record, outcome))

    return _line(cell)


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


RESULT_HEADER = result_header()
