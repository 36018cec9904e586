"""Measured/predicted tokens/sec per test and strategy over saved `--distperf-json` reports:
one row per test id, the ratio of each report in order, and how many lie within 0.85-1.15.

    python3 docs/benchmarks/prediction_table.py REPORT.json [...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def ratios(paths: list[str]) -> dict[str, list[float | None]]:
    by_test: dict[str, list[float | None]] = defaultdict(list)
    for path in paths:
        with open(path) as stream:
            for row in json.load(stream)["results"]:
                predicted = row.get("predicted_tokens_per_sec")
                ratio = row["tokens_per_sec"] / predicted if predicted else None
                by_test[row["test_id"].split("::", 1)[1]].append(ratio)
    return by_test


def main(paths: list[str]) -> None:
    print("| test | measured/predicted, each session | within 0.85-1.15 |")
    print("|---|---|---|")
    for test, values in sorted(ratios(paths).items()):
        shown = ", ".join("-" if v is None else f"{v:.2f}" for v in values)
        inside = sum(1 for v in values if v is not None and 0.85 <= v <= 1.15)
        print(f"| `{test}` | {shown} | {inside} of {len(values)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
