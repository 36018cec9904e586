"""Does a gloo rank burn CPU while it waits for a late peer? Rank 1 sleeps 1 s before a
barrier and before an all-reduce; each rank prints the wall and CPU seconds of both calls.

    python docs/benchmarks/cpu/gloo_wait_cpu_probe.py
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LATE_S = 1.0


def _timed(call: object, rank: int) -> tuple[float, float]:
    """(wall, CPU) seconds of `call()`, rank 1 arriving LATE_S late."""
    if rank == 1:
        time.sleep(LATE_S)
    cpu, wall = time.process_time(), time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - wall, time.process_time() - cpu


def _rank(rank: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29731")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    dist.barrier()
    barrier = _timed(dist.barrier, rank)
    message = torch.zeros(16)
    reduce = _timed(lambda: dist.all_reduce(message), rank)
    print(
        f"rank {rank}: barrier wall {barrier[0]:.3f} s cpu {barrier[1]:.3f} s | "
        f"all_reduce wall {reduce[0]:.3f} s cpu {reduce[1]:.3f} s",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_rank, nprocs=2)
