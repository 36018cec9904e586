"""Measured vs predicted tokens/sec for saved `--distperf-json` reports, by the plugin's own code.

    python docs/benchmarks/predict_from_results.py LINK_CLASS REPORT.json [...]

Each row is predicted from what that run itself recorded: the session calibration (collectives
at the model's message sizes, measured in the ranks), the run's single-process reference time
per token and, for a run compiled around its wrapper's hooks, those per-unit costs, as
`Gate.prediction` does during a test, less its prefill term (reports keep no bare prefill).
"""

from __future__ import annotations

import json
import sys

from distperf_model.config import Config

from pytest_distperf.perfmodel import (
    DEFAULT_OVERHEADS,
    Calibration,
    links_from_calibration,
)
from pytest_distperf.spec import PRECISION_BYTES
from pytest_distperf.strategies import predict_for as predict


def rows(link_class: str, paths: list[str]) -> list[str]:
    out = []
    for path in paths:
        with open(path) as stream:
            results = json.load(stream)["results"]
        calibration = next(r["calibration"] for r in results if r.get("calibration"))
        links = links_from_calibration(Calibration.from_dict(calibration), link_class)
        for r in results:
            w = r["workload"]
            p = predict(
                Config.from_name(w["model"]),
                r["strategy"],
                r["devices"],
                links,
                device_type=r["accelerator"],
                batch_size=w["batch_size"],
                prompt_length=w["prompt_length"],
                max_new_tokens=w["max_new_tokens"],
                dtype_bytes=PRECISION_BYTES[w["precision"]],
                compute_time_s=r["reference_token_s"],
                overheads=(
                    DEFAULT_OVERHEADS.around_graph_breaks()
                    if r.get("graph_breaks")
                    else DEFAULT_OVERHEADS
                ),
            )
            error = (p.tokens_per_sec - r["tokens_per_sec"]) / r["tokens_per_sec"]
            out.append(
                f"| {w['model']} | {r['strategy']} | {r['implementation']['sharding']} | "
                f"{r['tokens_per_sec']:.2f} | {p.tokens_per_sec:.2f} | {error:+.0%} | {p.bound} |"
            )
    return out


if __name__ == "__main__":
    print("| model | strategy | implementation | measured | predicted | error | bound |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows(sys.argv[1], sys.argv[2:])))
