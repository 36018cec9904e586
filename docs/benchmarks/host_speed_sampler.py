"""The host CPU's speed over time, sampled beside a benchmark: a diagnostic, not part of the plugin.

Every `--interval` seconds, times a fixed piece of pure-Python work and appends one JSON line
(wall-clock epoch seconds, milliseconds taken) to `--out`, until killed or `--seconds` pass. On
a host whose vCPU switches speed, this says when, so a benchmark's slow runs can be laid beside it.

    python3 docs/benchmarks/host_speed_sampler.py --out host-speed.jsonl &
"""

from __future__ import annotations

import argparse
import json
import time


def python_work() -> float:
    """Seconds for a fixed loop of integer arithmetic: the interpreter's speed on this core."""
    start = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i * i % 7
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=3600.0)
    args = parser.parse_args()
    origin = time.monotonic()
    with open(args.out, "a") as out:
        while time.monotonic() - origin < args.seconds:
            row = {"t": round(time.time(), 3), "python_ms": round(python_work() * 1e3, 3)}
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
