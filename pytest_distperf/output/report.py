"""Renderings of results: the JSON report and the terminal table."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.store.files import atomic_write_text

REPORT_SCHEMA = 1


def write_json_report(path: str | os.PathLike[str], rows: Sequence[dict[str, Any]]) -> Path:
    """Write all rows atomically: a reader never sees half a report."""
    text = json.dumps({"schema": REPORT_SCHEMA, "results": list(rows)}, indent=2, sort_keys=True)
    return atomic_write_text(path, text + "\n")


RESULT_HEADER = (
    f"{'tok/s':>10} {'decode':>9} {'ttft ms':>8} {'strategy':<15} {'ranks':<9} "
    f"{'predicted':>9} {'bound':<13} {'baseline':>9} {'change':>7} {'detect':>6} "
    f"{'rel.chg':>7} {'detect':>6}  {'verdict':<18} test"
)


def format_result_line(nodeid: str, outcome: str, props: dict[str, Any]) -> str:
    def number(key: str, spec: str) -> str:
        value = props.get(key)
        width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
        return format(value, spec) if isinstance(value, (int, float)) else "-".rjust(width)

    ranks = f"{props['distperf_devices']} x {props['distperf_accelerator']}"
    verdict = props.get("distperf_verdict", "ok") if outcome == "passed" else "FAILED"
    return (
        f"{number('distperf_tokens_per_sec', '10.2f')} "
        f"{number('distperf_decode_tokens_per_sec', '9.2f')} "
        f"{number('distperf_ttft_ms', '8.1f')} {props['distperf_strategy']:<15} {ranks:<9} "
        f"{number('distperf_predicted_tokens_per_sec', '9.2f')} "
        f"{props.get('distperf_bound', '-'):<13} "
        f"{number('distperf_baseline_tokens_per_sec', '9.2f')} "
        f"{number('distperf_change', '+7.1%')} {number('distperf_detectable_drop', '6.0%')} "
        f"{number('distperf_relative_speed_change', '+7.1%')} "
        f"{number('distperf_relative_speed_detectable_drop', '6.0%')}  "
        f"{verdict:<18} {nodeid}"
    )
