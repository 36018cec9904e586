"""What a distperf test costs beyond its own work, with the rank pool and with fresh ranks.

Runs a generated suite of N identical tests (pythia-14m, 4 new tokens, 2 repeats, as the pool
issue measured) in one pytest session per (mode, N), and prints per mode: the wall time of the
session, the cost of each extra test ((T[N2] - T[N1]) / (N2 - N1)), the mean work the ranks did
per test (`work_s`: build, warm-up, timed and bare generations), the harness's share of each
extra test (cost per extra test minus its work) and the first timed token after pytest started.

    python docs/benchmarks/pool_cost.py --devices 2 --accelerator cpu
    python docs/benchmarks/pool_cost.py --devices 1 --accelerator cuda --model pythia-1b

Run it alone: on a 2-core host anything else running moves the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEST = """
import pytest

@pytest.mark.parametrize("n", range({n}))
@pytest.mark.distperf(model={model!r}, max_new_tokens={tokens}, efficiency=0.05)
def test_same(distperf, n):
    distperf.run()
"""


def run_session(
    directory: Path, n: int, fresh: bool, args: argparse.Namespace
) -> tuple[float, list[dict]]:
    (directory / "test_cost.py").write_text(TEST.format(n=n, model=args.model, tokens=args.tokens))
    report = directory / "report.json"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--distperf-devices={args.devices}",
        f"--distperf-accelerator={args.accelerator}",
        f"--distperf-repeats={args.repeats}",
        f"--distperf-json={report}",
        "test_cost.py",
    ]
    if fresh:
        command.append("--distperf-fresh-ranks")
    start = time.perf_counter()
    done = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    return wall, json.loads(report.read_text())["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--model", default="pythia-14m")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs=2, default=(2, 10))
    parser.add_argument("--modes", nargs="+", default=("pool", "fresh"))
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    small, large = args.sizes
    out: dict[str, dict] = {}
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as tmp:
            walls, rows = {}, {}
            for n in (small, large):
                walls[n], rows[n] = run_session(Path(tmp), n, mode == "fresh", args)
        later = rows[large][1:]  # the first test also starts the pool and calibrates
        per_extra = (walls[large] - walls[small]) / (large - small)
        work = statistics.mean(r["work_s"] for r in later) if later[0].get("work_s") else None
        out[mode] = {
            "wall_s": walls,
            "per_extra_test_s": per_extra,
            "mean_work_s": work,
            "harness_per_extra_test_s": None if work is None else per_extra - work,
            "first_timed_after_start_s": rows[large][0]["session_to_first_timed_s"],
            "launch_s": [r["launch_s"] for r in rows[large]],
            "work_s": [r.get("work_s") for r in rows[large]],
        }
    print(
        f"{'mode':6} {'T' + str(small):>8} {'T' + str(large):>8} {'extra':>7} {'work':>7} "
        f"{'harness':>8} {'1st timed':>9}"
    )
    for mode, o in out.items():
        work = "-" if o["mean_work_s"] is None else f"{o['mean_work_s']:.2f}"
        harness = o["harness_per_extra_test_s"]
        print(
            f"{mode:6} {o['wall_s'][small]:8.1f} {o['wall_s'][large]:8.1f} "
            f"{o['per_extra_test_s']:7.2f} {work:>7} "
            f"{'-' if harness is None else f'{harness:.2f}':>8} "
            f"{o['first_timed_after_start_s']:9.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
