"""cpu_unchanged_reruns.sh's table: per group of sessions, the verdicts of each test and the
figures behind them.

    python docs/benchmarks/unchanged_reruns_summary.py OUTDIR
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for report in sorted(out.glob("*.json")):
        group = report.stem.rsplit("-", 1)[0] if "same" in report.stem else report.stem
        for row in json.loads(report.read_text())["results"]:
            groups[group].append(row)
    print("| sessions | test | results | verdicts | tok/s | change vs baseline |")
    print("|---|---|---|---|---|---|")
    for group, rows in groups.items():
        for test in sorted({r["test_id"].split("::")[-1] for r in rows}):
            mine = [r for r in rows if r["test_id"].endswith(test)]
            verdicts = collections.Counter(r["verdict"] for r in mine)
            rates = [r["tokens_per_sec"] for r in mine]
            changes = [100 * r["change"] for r in mine if r.get("change") is not None]
            said = ", ".join(f"{n} {v}" for v, n in verdicts.most_common())
            span = f"{min(changes):+.1f}% .. {max(changes):+.1f}%" if changes else "-"
            print(
                f"| {group} | {test} | {len(mine)} | {said} | {min(rates):.1f}-{max(rates):.1f} "
                f"| {span} |"
            )
    for group, rows in groups.items():
        for row in rows:
            if row["verdict"] != "ok":
                print(f"\n{group} {row['test_id'].split('::')[-1]} {row['verdict']}:")
                for key in sorted(k for k in row if k.endswith("_message") and row[k]):
                    status = row.get(key.replace("_message", "_status"))
                    if status not in ("ok", "skip", None):
                        print(f"  {key} ({status}): {row[key][:300]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
