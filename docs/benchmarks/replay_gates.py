"""Replay saved gate runs through the plugin's decision code, with a recorded-run history.

    python docs/benchmarks/replay_gates.py REFRESHES RUN.json [RUN.json ...]

The first REFRESHES reports play baseline refreshes (`--distperf-update-baselines` on, say,
main-branch CI): each becomes a `BaselineEntry` following the previous one, exactly as
`BaselineStore.save` keeps them (samples of the last, run medians of all). Every later report
is judged by the plugin's own `baseline_check` (throughput, with the busy evidence the report
has) and `relative_speed_check` under the default settings; the ranks' own waits need the
ranks' samples, which a report does not keep, so they are not replayed. Only measured samples
go in; nothing is simulated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_distperf.judge.checks import BaselineFigures, GateSettings, RelativeSpeedFigures
from pytest_distperf.judge.throughput import baseline_check, relative_speed_check
from pytest_distperf.store.entry import BaselineEntry


def _rows(path: str) -> dict[str, dict]:
    results = json.loads(Path(path).read_text())["results"]
    return {r["test_id"].split("::")[-1]: r for r in results}


def _entry(test: str, row: dict) -> BaselineEntry:
    return BaselineEntry.from_samples(
        test,
        row["tokens_per_sec_samples"],
        peak_memory_bytes=None,
        versions={},
        relative_samples=row.get("relative_speed_samples") or (),
        host_loop_samples=row.get("host_loop_samples") or (),
        waits={
            "run_queue_wait_run_medians": row.get("run_queue_wait_per_token_s"),
            "steal_run_medians": row.get("steal_per_token_s"),
        },
    )


def _result(row: dict) -> Any:
    """The report's row as the figures the checks read (no ranks: no waits of their own)."""
    return SimpleNamespace(
        spec=SimpleNamespace(accelerator=row.get("accelerator", "cpu")),
        tokens_per_sec_samples=row["tokens_per_sec_samples"],
        relative_speed_samples=row.get("relative_speed_samples") or (),
        relative_speed_unqueued_samples=(),
        host_loop_cpu_samples=row.get("host_loop_cpu_samples") or (),
        run_queue_wait_per_token_s=row.get("run_queue_wait_per_token_s"),
        steal_per_token_s=row.get("steal_per_token_s"),
        training=row.get("mode") == "train",
        ranks=(),
        samples=(),
    )


def main(refreshes: int, paths: list[str]) -> None:
    runs = [_rows(p) for p in paths]
    recorded, later = runs[:refreshes], list(zip(paths[refreshes:], runs[refreshes:], strict=True))
    settings = GateSettings(efficiency=0.7, tolerance=None)
    # Only tests that every recorded run has (a test added later has a shorter history).
    for test in [t for t in recorded[-1] if all(t in run for run in recorded)]:
        entry = _entry(test, recorded[0][test])
        for run in recorded[1:]:
            entry = _entry(test, run[test]).following(entry)
        print(f"\n{test}: {refreshes} recorded runs")
        for path, run in later:
            result = _result(run[test])
            checks = (
                baseline_check(entry, result, settings, "k", []),
                relative_speed_check(entry, result, settings),
            )
            print(f"  {Path(path).stem:<10}", end="")
            for check in checks:
                figures = ""
                if isinstance(check.figures, BaselineFigures | RelativeSpeedFigures):
                    change, tolerance = check.figures.change, check.figures.tolerance
                    figures = f" {change:+6.1%} (tol {tolerance:.1%}) {check.figures.verdict}"
                print(f"  {check.name} {check.status}{figures}", end="")
            print()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
