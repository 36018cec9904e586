"""Replay saved gate runs through the plugin's decision code, with a recorded-run history.

    python docs/benchmarks/replay_gates.py REFRESHES RUN.json [RUN.json ...]

The first REFRESHES reports play baseline refreshes (`--distperf-update-baselines` on, say,
main-branch CI): each becomes a `BaselineEntry` following the previous one, exactly as
`BaselineStore.save` keeps them (samples of the last, run medians of all). Every later report
is judged by the plugin's own `baseline_check` (throughput), `relative_speed_check` and
`machine_check` (reports with the host-speed loop) under the default settings. Only measured
samples go in; nothing is simulated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pytest_distperf.judge.busy import machine_check
from pytest_distperf.judge.checks import (
    MACHINE_SLOWER,
    BaselineFigures,
    GateSettings,
    RelativeSpeedFigures,
    baseline_check,
    relative_speed_check,
)
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
            row = run[test]
            throughput = baseline_check(entry, row["tokens_per_sec_samples"], settings, "k", [])
            relative = relative_speed_check(
                entry, row.get("relative_speed_samples") or (), settings
            )
            host = row.get("host_loop_samples") or ()
            checks = (machine_check(throughput, relative, entry, host), relative)
            print(f"  {Path(path).stem:<10}", end="")
            for check in checks:
                figures = ""
                if isinstance(check.figures, BaselineFigures | RelativeSpeedFigures):
                    change, tolerance = check.figures.change, check.figures.tolerance
                    figures = f" {change:+6.1%} (tol {tolerance:.1%})"
                    if check.figures.verdict == MACHINE_SLOWER:
                        figures += " machine slower"
                print(f"  {check.name} {check.status}{figures}", end="")
            print()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
