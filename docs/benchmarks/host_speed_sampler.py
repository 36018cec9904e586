"""The host CPU's speed over time, sampled beside a benchmark: a diagnostic, not part of the plugin.

Every `--interval` seconds, times the plugin's fixed interpreter loop (hostspeed.py) and
appends one JSON line (wall-clock epoch seconds, milliseconds taken) to `--out`, until killed
or `--seconds` pass. On a host whose vCPU switches speed, this says when, so a benchmark's slow
runs can be laid beside it.

    python3 docs/benchmarks/host_speed_sampler.py --out host-speed.jsonl &
"""

from __future__ import annotations

import argparse
import json
import time

from pytest_distperf.ranks.hostspeed import interpreter_loop_seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=3600.0)
    args = parser.parse_args()
    origin = time.monotonic()
    with open(args.out, "a") as out:
        while time.monotonic() - origin < args.seconds:
            row = {
                "t": round(time.time(), 3),
                "python_ms": round(interpreter_loop_seconds() * 1e3, 3),
            }
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
