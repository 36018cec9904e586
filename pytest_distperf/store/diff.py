"""`distperf baselines diff`: per test of two snapshots, its status, old and new median, recorded
runs and counted work, as JSON rows, text or a Markdown table for a review. Pure."""

from __future__ import annotations

from typing import Any

from pytest_distperf.store.snapshot import Snapshot
from pytest_distperf.work import work_cell


def diff_rows(old: Snapshot, new: Snapshot) -> list[dict[str, Any]]:
    """One row per test of either snapshot, by topology key and test id: added, removed,
    changed (any field, a refresh's date included) or unchanged."""
    rows = []
    for key in sorted(old.entries.keys() | new.entries.keys()):
        before, after = old.entries.get(key, {}), new.entries.get(key, {})
        for test_id in sorted(before.keys() | after.keys()):
            a, b = before.get(test_id), after.get(test_id)
            status = "added" if a is None else "removed" if b is None else "changed"
            if a is not None and b is not None and a.to_dict() == b.to_dict():
                status = "unchanged"
            rows.append(
                {
                    "topology_key": key,
                    "test_id": test_id,
                    "status": status,
                    "old_median_tokens_per_sec": a and a.median,
                    "new_median_tokens_per_sec": b and b.median,
                    "change": b.median / a.median - 1 if a and b else None,
                    "old_runs": a and len(a.run_medians or (a.median,)),
                    "new_runs": b and len(b.run_medians or (b.median,)),
                    "old_work": a and work_cell(a.work),
                    "new_work": b and work_cell(b.work),
                    "new_commit": b and b.commit,
                }
            )
    return rows


def diff_text(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if row["status"] == "unchanged":
            continue
        lines.append(f"  {row['status']:<8} {row['topology_key']}: {row['test_id']}")
        lines.append(
            f"           median {_rate(row, 'old')} -> {_rate(row, 'new')} tok/s"
            f"{_change(row)}, runs {row['old_runs'] or '-'} -> {row['new_runs'] or '-'}"
            f"; work {_work(row)}"
        )
    return lines


def diff_markdown(rows: list[dict[str, Any]]) -> list[str]:
    changed = [row for row in rows if row["status"] != "unchanged"]
    if not changed:
        return ["", "No baseline changed."]
    lines = [
        "",
        "| status | machine | test | old tok/s | new tok/s | change | runs | work |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for row in changed:
        test = row["test_id"].replace("|", "\\|")
        runs = f"{row['old_runs'] or '-'} → {row['new_runs'] or '-'}"
        cells = [
            row["status"],
            f"`{row['topology_key']}`",
            f"`{test}`",
            _rate(row, "old"),
            _rate(row, "new"),
            _change(row).strip(" ()") or "-",
            runs,
            _work(row),
        ]
        lines.append(f"| {' | '.join(cells)} |")
    return lines


def _rate(row: dict[str, Any], side: str) -> str:
    value = row[f"{side}_median_tokens_per_sec"]
    return "-" if value is None else f"{value:.4g}"


def _change(row: dict[str, Any]) -> str:
    return "" if row["change"] is None else f" ({row['change']:+.1%})"


def _work(row: dict[str, Any]) -> str:
    old, new = row["old_work"], row["new_work"]
    return f"{new} (same)" if old == new else f"{old or '-'} -> {new or '-'}"
