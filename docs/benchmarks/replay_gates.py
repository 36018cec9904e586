"""Replay saved gate runs through the plugin's decision code, with a recorded-run history.

    python docs/benchmarks/replay_gates.py REFRESHES RUN.json [RUN.json ...]

The first REFRESHES reports play baseline refreshes (`--distperf-update-baselines` on, say,
main-branch CI): the last of them gives the baseline's samples and all of them its run medians,
exactly as `BaselineStore.save` would have kept them. Every later report is compared with
`stats.compare` under the default settings (tolerance floor 10%, alpha 0.01). Only measured
samples go in; nothing is simulated.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from pytest_distperf.stats import compare
from pytest_distperf.verdict import GateSettings


def _samples(path: str) -> dict[str, list[float]]:
    results = json.loads(Path(path).read_text())["results"]
    return {r["test_id"].split("::")[-1]: r["tokens_per_sec_samples"] for r in results}


def main(refreshes: int, paths: list[str]) -> None:
    runs = [_samples(p) for p in paths]
    recorded, later = runs[:refreshes], list(zip(paths[refreshes:], runs[refreshes:], strict=True))
    defaults = GateSettings(efficiency=0.7, tolerance=None)
    for test in recorded[-1]:
        history = [statistics.median(r[test]) for r in recorded]
        print(
            f"\n{test}: run medians of the {refreshes} recorded runs "
            + ", ".join(f"{m:.1f}" for m in history)
        )
        for path, run in later:
            c = compare(
                recorded[-1][test],
                run[test],
                alpha=defaults.alpha,
                tolerance_floor=defaults.tolerance_floor,
                run_medians=history,
            )
            print(
                f"  {Path(path).stem:<10} {c.verdict:<11} change {c.change:+6.1%}  tolerance "
                f"{c.tolerance:.1%}  p={c.p_value:.3g}  detectable {c.detectable_drop:.1%}"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
