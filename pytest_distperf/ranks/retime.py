"""The re-timing where ranks time themselves (Platform.ranks_time_themselves): right after the
timed repeats, the same wrapped generation or step timed again as they were, knobs off, the
bare model beside each where the repeats had one (a drifting host moves the pair alike). The
re-timing check (judge/threshold.py) compares the repeats with it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from distperf_model.parallelize import comm_delays_paused

from pytest_distperf.measured import Sample

# At most this many, as many as fit in the budget (Platform.retime_budget_s) after the first
# (which counts: the model is warm from the repeats); every rank runs as many as the slowest
# rank's first allows.
MOST = 5

Retimed = tuple[tuple[Sample, ...], tuple[Sample, ...]]


def retimed(
    timed_once: Callable[[], Sample],
    budget_s: float,
    beside: Callable[[], Sample | None] | None = None,
) -> Retimed:
    """`timed_once`, knobs off, each followed by `beside` (None: none), as often as the budget
    allows; the bare samples are empty where the copy was dropped."""
    wrapped: list[Sample] = []
    bare: list[Sample | None] = []

    def pair() -> float:
        with comm_delays_paused():
            wrapped.append(timed_once())
        bare.append(beside() if beside is not None else None)
        return wrapped[-1].total_s + (bare[-1].total_s if bare[-1] is not None else 0.0)

    first = pair()
    plan = torch.tensor([max(1, min(MOST, int(budget_s / max(first, 1e-9))))])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(plan, op=dist.ReduceOp.MIN)  # the same count on every rank
    for _ in range(int(plan) - 1):
        pair()
    beside_all = tuple(s for s in bare if s is not None)
    return tuple(wrapped), beside_all if len(beside_all) == len(wrapped) else ()
