"""Soak of the rank pool: 200 tests in one session, a rank exception every 50 tests.

Generates a suite of four blocks of 50 tests (tiny model; `auto` and `fsdp-noreshard`), each
block holding one test whose model raises on rank 1, runs it in one pytest session on CPU ranks,
and samples
after every test: the pytest process's RSS and open files, its live child processes and their
RSS. Prints the outcome counts and the levels after test 10 against the end; writes every sample
as JSON lines with --samples.

    python docs/benchmarks/pool_soak.py --samples docs/benchmarks/data/pool/soak.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BUILDERS = """
import os

from distperf_model.config import Config
from distperf_model.model import build_model


def raising(seed, device, dtype):
    if os.environ["RANK"] == "1":
        raise ValueError("injected soak failure on rank 1")
    return build_model(Config.from_name("tiny"), seed, device, dtype)
"""

SUITE = """
import pytest

# Four blocks of 50 tests: 48 healthy (24 x two strategies), one whose rank 1 raises, one more
# healthy test, so one injected failure every 50 tests.
for block in range(4):
    @pytest.mark.strategy("auto", "fsdp-noreshard")
    @pytest.mark.distperf(model="tiny", max_new_tokens=4, efficiency=0.05)
    @pytest.mark.parametrize("n", range(24))
    def test_healthy(distperf, n):
        distperf.run()

    @pytest.mark.distperf(model="soakmod:raising", max_new_tokens=4, efficiency=0.05)
    def test_injected(distperf):
        distperf.run()

    @pytest.mark.distperf(model="tiny", max_new_tokens=4, efficiency=0.05)
    def test_after(distperf):
        distperf.run()

    globals()[f"test_{block}_healthy"] = test_healthy
    globals()[f"test_{block}_injected"] = test_injected
    globals()[f"test_{block}_after"] = test_after
del test_healthy, test_injected, test_after
"""

SAMPLER = """
import json
import os
from pathlib import Path

OUT = Path(os.environ["SOAK_SAMPLES"])


def _status(pid, field):
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


def _children(pid):
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _status(entry.name, "PPid") is not None:
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                found.append(int(entry.name))
    return found


def pytest_runtest_logfinish(nodeid, location):
    me = os.getpid()
    children = _children(me)
    sample = {
        "test": nodeid,
        "pytest_rss": _status(me, "VmRSS"),
        "pytest_open_files": len(os.listdir("/proc/self/fd")),
        "children": len(children),
        "children_rss": sorted(_status(c, "VmRSS") or 0 for c in children),
        "children_open_files": sorted(len(os.listdir(f"/proc/{c}/fd")) for c in children),
    }
    with OUT.open("a") as f:
        f.write(json.dumps(sample) + "\\n")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", help="write every sample here (JSON lines)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "soakmod.py").write_text(BUILDERS)
        (directory / "test_soak.py").write_text(SUITE)
        (directory / "conftest.py").write_text(SAMPLER)
        samples = directory / "samples.jsonl"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--distperf-devices=2",
            ],
            cwd=directory,
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "SOAK_SAMPLES": str(samples)},
        )
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        if args.samples:
            Path(args.samples).parent.mkdir(parents=True, exist_ok=True)
            Path(args.samples).write_text(samples.read_text())
    summary = done.stdout.strip().splitlines()[-1]
    print("outcome:", summary)
    print("failed tests:", re.findall(r"FAILED (\S+)", done.stdout))
    print(f"samples: {len(rows)}")
    early, end = rows[9], rows[-1]
    for name in ("pytest_rss", "pytest_open_files", "children"):
        print(f"{name:20} after test 10: {early[name]:>12}  at the end: {end[name]:>12}")
    for name in ("children_rss", "children_open_files"):
        print(f"{name:20} after test 10: {early[name]}  at the end: {end[name]}")
    peak = max(r["pytest_rss"] for r in rows[9:])
    print(f"pytest RSS peak after test 10 over its level then: {peak / early['pytest_rss']:.3f}")


if __name__ == "__main__":
    main()
