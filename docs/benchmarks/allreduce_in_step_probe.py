"""What one small all-reduce costs on gloo CPU ranks, timed three ways (issue 24's tp miss):

* fenced: a barrier before every call, the median (how ranks/calibrate.py times it);
* back to back: calls in a row, no barrier, the mean;
* in step: each call after a burst of compute of a decode layer's size, no barrier, the mean,
  less the bursts timed alone: what a tensor-parallel decode pays per all-reduce.

    python docs/benchmarks/allreduce_in_step_probe.py [--bytes 512] [--burst-ms 0.5] > probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CALLS = 200


def _burst(weight: torch.Tensor, x: torch.Tensor, repeats: int) -> torch.Tensor:
    for _ in range(repeats):
        x = torch.tanh(weight @ x)
    return x


def _repeats_for(weight: torch.Tensor, x: torch.Tensor, target_s: float) -> int:
    start = time.perf_counter()
    _burst(weight, x, 100)
    per = (time.perf_counter() - start) / 100
    return max(1, round(target_s / per))


def _rank(rank: int, world: int, port: int, nbytes: int, burst_s: float, out: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    message = torch.ones(max(1, nbytes // 4))
    weight, x = torch.randn(128, 128), torch.randn(128, 1)
    repeats = _repeats_for(weight, x, burst_s)
    for _ in range(20):  # connections and caches
        dist.all_reduce(message)
    fenced = []
    for _ in range(CALLS):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(message)
        fenced.append(time.perf_counter() - start)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        dist.all_reduce(message)
    back_to_back = (time.perf_counter() - start) / CALLS
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        _burst(weight, x, repeats)
    burst_alone = (time.perf_counter() - start) / CALLS
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        _burst(weight, x, repeats)
        dist.all_reduce(message)
    in_step = (time.perf_counter() - start) / CALLS - burst_alone
    figures = {
        "rank": rank,
        "fenced_median_s": statistics.median(fenced),
        "back_to_back_mean_s": back_to_back,
        "burst_alone_s": burst_alone,
        "in_step_excess_s": in_step,
    }
    dist.destroy_process_group()
    out.put(figures)  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bytes", type=int, default=512)
    parser.add_argument("--burst-ms", type=float, default=0.5)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [
        ctx.Process(target=_rank, args=(r, args.world, port, args.bytes, args.burst_ms / 1e3, out))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    ranks = sorted((out.get(timeout=300) for _ in procs), key=lambda f: f["rank"])
    for p in procs:
        p.join()
    info = {"torch": torch.__version__, "cpus": os.cpu_count(), "bytes": args.bytes}
    print(json.dumps({**info, "burst_ms": args.burst_ms, "ranks": ranks}, indent=1))


if __name__ == "__main__":
    main()
