"""A Markdown summary of a distperf JSON report, for CI job summaries and merge-request notes.

    python -m pytest_distperf.output.markdown distperf.json [--title TITLE]

prints one table row per result: test, strategy, devices, tok/s, and, when the rows carry them,
the baseline (``baseline_tokens_per_sec``), the change (``change``: current / baseline - 1), the
relative speed and its change (``relative_speed``, ``relative_speed_change``) and the
``verdict``; then the message of every check that failed or warned (``<check>_message``). Plain
standard library, so it runs where the report is, torch or not.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_PASSING = frozenset({"ok", "pass", "passed"})
# The plugin's checks, in the order a reader wants their messages (verdict.py).
_CHECKS = ("threshold", "baseline", "relative_speed", "memory")
_TELLING = frozenset({"fail", "warn"})
_MISSING = "–"


def render_markdown(
    report: Mapping[str, Any] | Sequence[Mapping[str, Any]], title: str = ""
) -> str:
    """The Markdown for a report (`{"schema": 1, "results": [...]}`) or a bare list of rows."""
    rows = list(report.get("results", ()) if isinstance(report, Mapping) else report)
    lines = [f"## {title or 'distperf results'}", ""]
    if not rows:
        lines.append("No distperf results: no test ran a measured generation.")
        return "\n".join(lines) + "\n"

    verdicts = Counter(str(row["verdict"]) for row in rows if row.get("verdict") is not None)
    facts = [f"{len(rows)} result{'s' if len(rows) != 1 else ''}"]
    for label, key in (("accelerator", "accelerator"), ("device", "device_name")):
        values = sorted({str(row[key]) for row in rows if row.get(key)})
        if values:
            facts.append(f"{label} {', '.join(values)}")
    keys = sorted({str(key) for row in rows if (key := _topology_key(row))})
    if keys:
        facts.append("topology " + ", ".join(f"`{key}`" for key in keys))
    if verdicts:
        facts.append(", ".join(f"{count} {verdict}" for verdict, count in sorted(verdicts.items())))
    lines += [" · ".join(facts), ""]

    lines.append(
        "| Test | Strategy | Devices | tok/s | Baseline tok/s | Change | Relative speed "
        "| Rel. change | Verdict |"
    )
    lines.append("|---|---|--:|--:|--:|--:|--:|--:|---|")
    for row in rows:
        cells = [
            f"`{row.get('test_id', '?')}`",
            str(row.get("strategy", _MISSING)),
            str(row.get("devices", _MISSING)),
            _rate(row.get("tokens_per_sec")),
            _rate(row.get("baseline_tokens_per_sec")),
            _change(row.get("change")),
            _ratio(row.get("relative_speed")),
            _change(row.get("relative_speed_change")),
            _verdict(row.get("verdict")),
        ]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")

    messages = [
        (row.get("test_id", "?"), name, row[f"{name}_message"])
        for row in rows
        for name in _CHECKS
        if row.get(f"{name}_status") in _TELLING and isinstance(row.get(f"{name}_message"), str)
    ]
    if messages:
        lines += ["", "<details><summary>Messages</summary>", ""]
        lines += [
            f"- `{test_id}` {name}: {' '.join(message.split())}"
            for test_id, name, message in messages
        ]
        lines += ["", "</details>"]
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
        report = json.loads(args.report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: error: cannot read report {args.report}: {error}\n")
    if not isinstance(report, Mapping | list) or (
        isinstance(report, Mapping) and not isinstance(report.get("results", []), list)
    ):
        parser.exit(2, f"{parser.prog}: error: {args.report} is not a distperf JSON report\n")
    text = render_markdown(report, title=args.title)
    # UTF-8 regardless of the runner's locale: the table uses a few non-ASCII characters.
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.flush()
    return 0


def _rate(value: Any) -> str:
    if not _is_number(value):
        return _MISSING
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _ratio(value: Any) -> str:
    return f"{value:.3f}" if _is_number(value) else _MISSING


def _change(value: Any) -> str:
    if _is_number(value):
        return f"{value:+.1%}"
    return _MISSING if value is None else str(value)


def _verdict(value: Any) -> str:
    if value is None:
        return _MISSING
    text = str(value)
    return text if text.lower() in _PASSING else f"**{text}**"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _cell(text: str) -> str:
    # A "|" splits a table cell even inside a code span on GitHub and GitLab.
    return text.replace("|", "\\|").replace("\n", " ")


def _topology_key(row: Mapping[str, Any]) -> str | None:
    key = row.get("topology_key")
    if key is None and isinstance(row.get("topology"), Mapping):
        key = row["topology"].get("key")
    return None if key is None else str(key)


if __name__ == "__main__":
    sys.exit(main())
