"""A Markdown summary of a distperf JSON report for CI job summaries:
`python -m pytest_distperf.output.markdown distperf.json [--title TITLE]`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pytest_distperf.jsonfields import NUMBER, get_field, json_object
from pytest_distperf.judge.checks import CHECK_NAMES, CheckStatus

REPORT_SCHEMA = 1  # what write_json_report (output/report.py) writes
_PASSING = frozenset({"ok", "pass", "passed"})
_TELLING = frozenset({CheckStatus.FAIL, CheckStatus.WARN})
_MISSING = "–"
# How a SummaryRow field's annotation is read from a JSON row.
_KINDS: dict[str, Any] = {"str | None": str, "int | None": int, "float | None": NUMBER}


class ReportError(ValueError):
    """A saved report that cannot be summarised; the message says where and why."""


@dataclass(frozen=True)
class Message:
    check: str
    status: CheckStatus
    text: str


@dataclass(frozen=True)
class SummaryRow:
    """What the summary (and a chart, output/charts.py) shows of one run, read from its JSON
    row; None where the run (or an older report) has no such figure."""

    test_id: str
    messages: tuple[Message, ...]  # every check's that ran, in the order the checks run
    strategy: str | None
    devices: int | None
    accelerator: str | None
    device_name: str | None
    topology_key: str | None
    tokens_per_sec: float | None
    baseline_tokens_per_sec: float | None
    change: float | None
    relative_speed: float | None
    relative_speed_change: float | None
    verdict: str | None
    predicted_tokens_per_sec: float | None
    threshold_tokens_per_sec: float | None
    bound: str | None

    @classmethod
    def from_json(cls, row: object, where: str) -> SummaryRow:
        """A row of a JSON report; ValueError naming `where` and the field when it is not one."""
        data = json_object(row, where)
        messages = []
        for name in CHECK_NAMES:
            status = get_field(data, f"{name}_status", str, where, optional=True)
            if status is not None:
                status = CheckStatus.parse(status, f"{where}: {name}_status")
                text = get_field(data, f"{name}_message", str, where, optional=True)
                messages.append(Message(name, status, text or ""))
        figures = {
            f.name: get_field(data, f.name, _KINDS[str(f.type)], where, optional=True)
            for f in fields(cls)[2:]
        }
        return cls(get_field(data, "test_id", str, where), tuple(messages), **figures)


def parse_report(document: object, source: str = "report") -> list[SummaryRow]:
    """The rows of a report (`{"schema": 1, "results": [...]}`, or a bare list of rows)."""
    try:
        if isinstance(document, list):
            rows = document
        else:
            data = json_object(document, source)
            schema = get_field(data, "schema", int, source, default=REPORT_SCHEMA)
            if schema != REPORT_SCHEMA:
                raise ValueError(f"{source}: unknown report schema {schema!r}")
            rows = get_field(data, "results", list, source)
        return [SummaryRow.from_json(row, f"{source}: results[{i}]") for i, row in enumerate(rows)]
    except ValueError as error:
        raise ReportError(f"not a distperf JSON report: {error}") from None


def render_markdown(summary: Sequence[SummaryRow], title: str = "") -> str:
    """The Markdown summary of these runs."""
    lines = [f"## {title or 'distperf results'}", ""]
    if not summary:
        lines.append("No distperf results: no test ran a measured generation.")
        return "\n".join(lines) + "\n"

    verdicts = Counter(row.verdict for row in summary if row.verdict is not None)
    facts = [f"{len(summary)} result{'s' if len(summary) != 1 else ''}"]
    for label, name, form in (
        ("accelerator", "accelerator", "{}"),
        ("device", "device_name", "{}"),
        ("topology", "topology_key", "`{}`"),
    ):
        values = sorted({getattr(row, name) for row in summary} - {None, ""})
        if values:
            facts.append(f"{label} " + ", ".join(form.format(value) for value in values))
    if verdicts:
        facts.append(", ".join(f"{count} {verdict}" for verdict, count in sorted(verdicts.items())))
    lines += [" · ".join(facts), ""]

    lines.append("| " + " | ".join(header for header, _, _ in COLUMNS) + " |")
    lines.append("|" + "|".join(_ALIGN[style] for _, _, style in COLUMNS) + "|")
    for row in summary:
        cells = [_written(getattr(row, name), style) for _, name, style in COLUMNS]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")

    telling = [
        f"- `{row.test_id}` {message.check}: {' '.join(message.text.split())}"
        for row in summary
        for message in row.messages
        if message.status in _TELLING and message.text
    ]
    if telling:
        lines += ["", "<details><summary>Messages</summary>", "", *telling, "", "</details>"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_distperf.output.markdown",
        description="Print a Markdown summary of a distperf JSON report (--distperf-json).",
    )
    parser.add_argument("report", type=Path, help="the JSON report written by --distperf-json")
    parser.add_argument("--title", default="", help="heading of the summary")
    args = parser.parse_args(argv)
    try:
        rows = parse_report(json.loads(args.report.read_text(encoding="utf-8")), str(args.report))
    except ReportError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except (OSError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: cannot read report {args.report}: {error}\n")
    # UTF-8 regardless of the runner's locale: the table uses a few non-ASCII characters.
    sys.stdout.buffer.write(render_markdown(rows, title=args.title).encode("utf-8"))
    sys.stdout.flush()
    return 0


def rate_text(value: float) -> str:
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _verdict(value: str) -> str:
    return value if value.lower() in _PASSING else f"**{value}**"


# How each style writes a value, and aligns its column.
_STYLES: dict[str, Callable[[Any], str]] = {
    "code": "`{}`".format,
    "text": str,
    "count": str,
    "rate": rate_text,
    "change": "{:+.1%}".format,
    "ratio": "{:.3f}".format,
    "verdict": _verdict,
}
_ALIGN = {
    style: "--:" if style in ("count", "rate", "change", "ratio") else "---" for style in _STYLES
}
# The table's columns, left to right: header, SummaryRow field, style.
COLUMNS = (
    ("Test", "test_id", "code"),
    ("Strategy", "strategy", "text"),
    ("Devices", "devices", "count"),
    ("tok/s", "tokens_per_sec", "rate"),
    ("Baseline tok/s", "baseline_tokens_per_sec", "rate"),
    ("Change", "change", "change"),
    ("Relative speed", "relative_speed", "ratio"),
    ("Rel. change", "relative_speed_change", "change"),
    ("Verdict", "verdict", "verdict"),
)


def _written(value: Any, style: str) -> str:
    """The value in its style; a dash where the run has none (None, or not a finite number)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return _MISSING
    return _STYLES[style](value)


def _cell(text: str) -> str:
    # A "|" splits a table cell even inside a code span on GitHub and GitLab.
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.exit(main())
