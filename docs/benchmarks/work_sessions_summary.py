"""Summarise work_sessions.sh's sessions: per test, how many distinct `work` values the sessions
counted (1 means identical every time), the work gate's statuses, and the timing figures.

    python docs/benchmarks/work_sessions_summary.py SESSIONS_DIR > summary.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def summarise(folder: Path) -> dict[str, Any]:
    works: dict[str, set[str]] = defaultdict(set)
    statuses: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    rates: dict[str, list[float]] = defaultdict(list)
    sessions = sorted(folder.glob("*.json"), key=lambda p: int(p.stem))
    for path in sessions:
        for row in json.loads(path.read_text())["results"]:
            test = row["test_id"]
            works[test].add(json.dumps(row["work"], sort_keys=True))
            for check in ("work", "threshold", "baseline"):
                statuses[test][check][row.get(f"{check}_status", "not run")] += 1
            rates[test].append(row["tokens_per_sec"])
    return {
        "sessions": len(sessions),
        "tests": {
            test: {
                "distinct_work": len(works[test]),
                "statuses": {check: dict(c) for check, c in statuses[test].items()},
                "tokens_per_sec_min_max": [min(rates[test]), max(rates[test])],
                "sessions": len(rates[test]),
            }
            for test in sorted(works)
        },
    }


if __name__ == "__main__":
    json.dump(summarise(Path(sys.argv[1])), sys.stdout, indent=1)
    print()
