"""The re-timing where ranks time themselves (CPU ranks, one CUDA device): after the timed
repeats, the same wrapped generation or training step timed again the way they were timed
(each fenced), with the knobs off (no slow-down, comm_delay's sleeps paused). The judge's
re-timing check (judge/retiming.py) compares the repeats with it: a run disturbed or slowed
while it was timed ran slower than the same step just after. Several GPUs keep the model."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from distperf_model.parallelize import comm_delays_paused

from pytest_distperf.spec import Sample

# At most this many, as many as fit in the budget after the first (which counts: the model
# is warm from the repeats); every rank runs as many as the slowest rank's first allows.
MOST = 3
BUDGET_S = {"cpu": 0.6, "cuda": 2.0}


def retimed(timed_once: Callable[[], Sample], device: torch.device) -> tuple[Sample, ...]:
    """`timed_once` run again, knobs off: one first, then as many more as fit the budget."""
    with comm_delays_paused():
        first = timed_once()
        budget = BUDGET_S.get(device.type, BUDGET_S["cpu"])
        plan = torch.tensor([max(1, min(MOST, int(budget / max(first.total_s, 1e-9))))])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(plan, op=dist.ReduceOp.MIN)  # the same count on every rank
        return (first, *(timed_once() for _ in range(int(plan) - 1)))
