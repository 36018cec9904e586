"""Two --distperf-json reports of the same suite side by side: the keys each row has (added,
removed), and per test the verdict, each check's status, the threshold's ratio and tok/s.

    python docs/benchmarks/compare_reports.py before.json after.json
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

CHECKS = ("threshold_status", "baseline_status", "relative_speed_status", "work_status")


def rows(path: Path) -> dict[str, dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return {row["test_id"]: row for row in json.load(file)["results"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    before, after = rows(args.before), rows(args.after)
    keys_before = set().union(*(row.keys() for row in before.values()))
    keys_after = set().union(*(row.keys() for row in after.values()))
    print(f"keys added: {sorted(keys_after - keys_before)}")
    print(f"keys removed: {sorted(keys_before - keys_after)}")
    print("| test | verdict before -> after | checks before -> after | ratio | tok/s |")
    print("|---|---|---|---|---|")
    for test_id in sorted(before.keys() | after.keys()):
        b, a = before.get(test_id, {}), after.get(test_id, {})

        def checks(row: dict[str, Any]) -> str:
            return "/".join(str(row.get(name, "-")) for name in CHECKS)

        def figure(name: str, row: dict[str, Any]) -> str:
            value = row.get(name)
            return f"{value:.2f}" if isinstance(value, (int, float)) else "-"

        print(
            f"| `{test_id.split('::')[-1]}` | {b.get('verdict', '-')} -> {a.get('verdict', '-')}"
            f" | {checks(b)} -> {checks(a)}"
            f" | {figure('ratio_to_predicted', b)} -> {figure('ratio_to_predicted', a)}"
            f" | {figure('tokens_per_sec', b)} -> {figure('tokens_per_sec', a)} |"
        )


if __name__ == "__main__":
    main()
