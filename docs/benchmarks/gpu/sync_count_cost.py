"""What counting the host syncs adds to the counted generation (issue 44's target: at most 5%):
count_work on this project's pythia-410m (bf16, one CUDA device), alternating the profiler's
sync events off and on, 7 rounds each; prints the medians.

    python3 docs/benchmarks/gpu/sync_count_cost.py
"""

from __future__ import annotations

import statistics
import time

import torch
from distperf_model.config import Config
from distperf_model.generate import make_prompt
from distperf_model.model import build_model
from torch.profiler import ProfilerActivity, profile

from pytest_distperf.ranks import counting


def started_without_syncs() -> object:
    session = profile(activities=[ProfilerActivity.CUDA])
    session.start()
    return session


def main() -> None:
    device = torch.device("cuda")
    config = Config.from_name("pythia-410m")
    model = build_model(config, seed=0, device=device, dtype=torch.bfloat16)
    model.setup_caches(1, 128, device=device, dtype=torch.bfloat16)
    prompt = make_prompt(config, 1, 8, 0, device)
    with_syncs = counting._started
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.no_grad():
        counting.count_work(model, prompt, 64)  # warm
        for _ in range(7):
            for syncs in (False, True):
                counting._started = with_syncs if syncs else started_without_syncs
                start = time.perf_counter()
                counted = counting.count_work(model, prompt, 64)
                times[syncs].append(time.perf_counter() - start)
    counting._started = with_syncs
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"counted generation, sync events off: median {off * 1e3:.1f} ms {times[False]}")
    print(f"counted generation, sync events on:  median {on * 1e3:.1f} ms {times[True]}")
    print(f"added by counting the syncs: {on / off - 1:+.1%}")
    print("decode syncs per token:", counted.work.decode.syncs if counted.work.decode else None)


if __name__ == "__main__":
    main()
