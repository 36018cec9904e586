"""A saved report's one-device rows predicted two ways from what their ranks measured: the
compute scaled by the measured share (what the gate did before 6690582 for every row), or the
wrapper's own time added to the bare step (what it does since for a compiled run on a GPU).
For reports written before 6690582 (the bare step is the report's compute over the share). An
approximation: the prediction's other terms are kept as they were, the prefill term too.

    python3 docs/benchmarks/share_or_added.py REPORT.json [...]
"""

from __future__ import annotations

import json
import sys


def rows(path: str) -> list[str]:
    out = []
    with open(path) as stream:
        results = json.load(stream)["results"]
    for r in results:
        steps, bares = r.get("local_step_s"), r.get("local_bare_step_s")
        if r.get("mode") == "train" or not steps or not bares or None in steps + bares:
            continue
        terms = r["prediction"]["terms"]
        others = sum(terms.values()) - terms["compute"]
        step, bare = max(steps), max(bares)
        beside = terms["compute"] * bare / step  # the bare step the gate scaled
        measured = 1 / r["tokens_per_sec"]
        scaled = (terms["compute"] + others) / measured
        added = (beside + step - bare + others) / measured
        test = r["test_id"].split("::", 1)[1]
        out.append(f"| `{test}` | {scaled:.2f} | {added:.2f} | {bare / beside:.2f} |")
    return out


def main(paths: list[str]) -> None:
    print("| test | share x bare step | bare step + excess | measure's bare / beside |")
    print("|---|---|---|---|")
    for path in paths:
        print("\n".join(rows(path)))


if __name__ == "__main__":
    main(sys.argv[1:])
