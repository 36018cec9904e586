"""The session's own renderings of judged runs: the JSON report and the terminal table."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.store.files import atomic_write_text

REPORT_SCHEMA = 1


def write_json_report(path: str | os.PathLike[str], records: Sequence[JudgedRun]) -> Path:
    """Write every run's row atomically: a reader never sees half a report."""
    rows = [record.to_json() for record in records]
    text = json.dumps({"schema": REPORT_SCHEMA, "results": rows}, indent=2, sort_keys=True)
    return atomic_write_text(path, text + "\n")


RESULT_HEADER = (
    f"{'tok/s':>10} {'decode':>9} {'ttft ms':>8} {'strategy':<15} {'ranks':<9} "
    f"{'predicted':>9} {'bound':<13} {'baseline':>9} {'change':>7} {'detect':>6} "
    f"{'rel.chg':>7} {'detect':>6}  {'verdict':<18} test"
)


def format_result_line(record: JudgedRun, outcome: str) -> str:
    """One row of the table under RESULT_HEADER; `outcome` is the test's ("passed", ...).

    A figure the run does not have (no prediction, no baseline yet) shows as "-".
    """
    run, threshold, baseline, relative = (
        record.run,
        record.threshold,
        record.baseline,
        record.relative_speed,
    )
    ranks = f"{run.devices} x {run.accelerator}"
    verdict = record.decision.verdict if outcome == "passed" else "FAILED"
    predicted = threshold.predicted_tokens_per_sec if threshold else None
    return (
        f"{_number(run.tokens_per_sec, '10.2f')} "
        f"{_number(run.decode_tokens_per_sec, '9.2f')} "
        f"{_number(None if run.ttft_s is None else run.ttft_s * 1000, '8.1f')} "
        f"{run.strategy:<15} {ranks:<9} "
        f"{_number(predicted, '9.2f')} {threshold.bound if threshold else '-':<13} "
        f"{_number(baseline.baseline_tokens_per_sec if baseline else None, '9.2f')} "
        f"{_number(baseline.change if baseline else None, '+7.1%')} "
        f"{_number(record.detectable_drop, '6.0%')} "
        f"{_number(relative.change if relative else None, '+7.1%')} "
        f"{_number(relative.detectable_drop if relative else None, '6.0%')}  "
        f"{verdict:<18} {run.test_id}"
    )


def _number(value: float | None, spec: str) -> str:
    if value is None:
        width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
        return "-".rjust(width)
    return format(value, spec)
