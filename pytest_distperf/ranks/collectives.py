"""What a collective between host-run layers costs in a decode step (CPU ranks), timed on the
whole model before wrapping with an all-reduce after each of the strategy's collective points:
the ranks' drift and wake-ups are in it, as a fenced calibration call's are not
(docs/benchmarks/cpu-2026-12-02-allreduce-in-step.md)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from pytest_distperf.ranks.reference import step_seconds
from pytest_distperf.ranks.timing import Fences, GenerateFn, timed_generation

# Pairs of generations, one without the all-reduces and one with them, back to back: a host
# whose speed drifts moves both of a pair alike; after one untimed with them (the allocator,
# the caches and the group's connections warm).
PAIRS = 2


@torch.no_grad()
def in_step_seconds(
    module: Any,
    points_of: Callable[[Any], Sequence[torch.nn.Module]],
    prompt: torch.Tensor,
    steps: int,
    sync: Callable[[], None],
    generate: GenerateFn | None = None,
) -> float | None:
    """Seconds one all-reduce after a point (`points_of(module)`) adds to a decode step: the
    median over pairs of steps with and without, per point; None without a peer or points."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    try:
        points = points_of(module)
    except (TypeError, AttributeError, ValueError):  # the same model on every rank: all alike
        return None
    if not points:
        return None
    local = Fences(sync=sync, barrier=lambda: None)

    def step_s(summed: bool) -> float:
        handles = [point.register_forward_hook(_summed_copy) for point in points if summed]
        try:
            sample = timed_generation(module, prompt, steps, local, generate=generate)[0]
            return step_seconds(sample, steps)
        finally:
            for handle in handles:
                handle.remove()

    step_s(summed=True)
    excess = []
    for _ in range(PAIRS):
        alone = step_s(summed=False)
        excess.append(step_s(summed=True) - alone)
    return max(statistics.median(excess), 0.0) / len(points)


def _summed_copy(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
    # A copy: the whole model's own output is left as it was, every rank's being the same.
    dist.all_reduce(output.detach().clone())
