"""The verdict matrix's table from cpu_verdict_matrix.sh's JSON reports: per case and test,
how many sessions failed, warned or passed, each check's outcomes, and the busy evidence.

    python docs/benchmarks/verdict_matrix_summary.py OUTDIR
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    rows: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for report in sorted(out.glob("*.json")):
        case = report.stem.rsplit("-", 1)[0]
        for row in json.loads(report.read_text())["results"]:
            rows[case, row["test_id"].split("::")[-1]].append(row)
    print(
        "| case | test | sessions | verdicts | tok/s | change | off-CPU share change "
        "| wait for a core beyond, ms/token | core |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (case, test), group in sorted(rows.items()):
        verdicts = collections.Counter(row["verdict"] for row in group)
        rates = [row["tokens_per_sec"] for row in group]
        changes = [row.get("change") for row in group if row.get("change") is not None]
        evidence = [row.get("busy_evidence") or {} for row in group]
        waits = [
            e["run_queue_wait_per_token_s"]
            for e in evidence
            if e.get("run_queue_wait_per_token_s") is not None
        ]
        cores = [e["core_slowdown"] for e in evidence if e.get("core_slowdown") is not None]
        shares = [100 * r["off_cpu_share_change"] for r in group if r.get("off_cpu_share_change")]
        said = ", ".join(f"{n} {v}" for v, n in verdicts.most_common())
        changed = _span([100 * c for c in changes], "+.1f")
        waited = _span([1e3 * w for w in waits], ".2f")
        print(
            f"| {case} | {test} | {len(group)} | {said} | {_span(rates, '.1f')} | "
            f"{changed}% | {_span(shares, '+.1f')} | {waited} | {_span(cores, '.2f')} |"
        )


def _span(values: list[float], spec: str) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:{spec}}" if low == high else f"{low:{spec}}..{high:{spec}}"


if __name__ == "__main__":
    main(Path(sys.argv[1]))
