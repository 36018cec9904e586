"""Per test of a distperf JSON report: the measuring phases against the timed repeats, the
rate against the modelled prediction, and how the reference was obtained (issue 45).

    python3 docs/benchmarks/measuring_share.py report.json [more.json ...]

"measuring" is what the ranks do beside calibrating, building, wrapping, warming up and the
timed repeats (`phase_s`, the slowest rank's): the reference (before wrapping, or after the
repeats), the bare copy (beside the repeats), the own measure (the re-timing, where it still
runs) and the counted generation. The last line of each report sums them over its tests.
"""

from __future__ import annotations

import json
import sys

MEASURING = ("reference", "bare", "measure", "count")


def rows(path: str) -> None:
    with open(path) as file:
        results = json.load(file)["results"]
    print(f"== {path}")
    header = ("test", "verdict", "tok/s", "model", "ratio", "timed", *MEASURING, "share", "1st")
    print(" | ".join(header))
    total_timed = total_measuring = 0.0
    for r in results:
        phases = r.get("phase_s") or {}
        timed = phases.get("timed", 0.0)
        measuring = sum(phases.get(name, 0.0) for name in MEASURING)
        total_timed, total_measuring = total_timed + timed, total_measuring + measuring
        predicted = (r.get("prediction") or {}).get("tokens_per_sec")
        ratio = f"{r['tokens_per_sec'] / predicted:.2f}" if predicted else "-"
        first = r.get("session_to_first_timed_s")
        cells = (
            r["test_id"].split("::")[-1],
            r.get("verdict", "-"),
            f"{r['tokens_per_sec']:.2f}",
            f"{predicted:.2f}" if predicted else "-",
            ratio,
            f"{timed:.2f}",
            *(f"{phases.get(name, 0.0):.2f}" for name in MEASURING),
            f"{measuring / timed:.0%}" if timed else "-",
            f"{first:.1f}" if first is not None else "-",
        )
        print(" | ".join(cells), f"({r.get('reference_source') or 'no reference'})")
    if total_timed:
        print(
            f"all tests: measuring {total_measuring:.2f} s / timed {total_timed:.2f} s = "
            f"{total_measuring / total_timed:.0%}"
        )


if __name__ == "__main__":
    for report in sys.argv[1:]:
        rows(report)
