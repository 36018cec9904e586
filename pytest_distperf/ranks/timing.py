"""What is timed inside a rank: warm-up, then repeats of prefill + decode, each fenced by a
device synchronisation and a barrier so that no rank's clock starts before the others are ready
and no clock stops while kernels are still queued."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from distperf_model.generate import decode_one_token, prefill

from pytest_distperf.spec import Sample

T = TypeVar("T")


@dataclass(frozen=True)
class Fences:
    """How to wait for the device and for the other ranks."""

    sync: Callable[[], None]
    barrier: Callable[[], None]


def device_sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None  # CPU ops are synchronous


@torch.no_grad()
def timed_generation(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    fences: Fences,
    slowdown: float = 0.0,
) -> tuple[Sample, torch.Tensor]:
    """One generation, timed; returns the sample and the new tokens [B, max_new_tokens]."""
    batch, prompt_length = prompt.shape
    device = prompt.device
    fences.sync()
    fences.barrier()
    start = time.perf_counter()
    input_pos = torch.arange(prompt_length, device=device)
    token = prefill(model, prompt, input_pos)  # [B, 1]
    fences.sync()
    first = time.perf_counter()
    new_tokens = [token]
    # Built once and advanced on the device: a host-to-device copy per step would make the CPU
    # wait for the GPU every token and hide the launch overlap that eager decoding lives on.
    input_pos = torch.tensor([prompt_length], device=device)  # [1]
    for _ in range(max_new_tokens - 1):
        token = decode_one_token(model, token, input_pos)
        new_tokens.append(token)
        input_pos = input_pos + 1
    fences.sync()
    end = time.perf_counter()
    if slowdown:
        # The documented self-check knob: stretch the generation so the rate drops by `slowdown`.
        time.sleep((end - start) * slowdown / (1.0 - slowdown))
        end = time.perf_counter()
    sample = Sample(total_s=end - start, ttft_s=first - start, decode_s=end - first)
    return sample, torch.cat(new_tokens, dim=1)


def run_workload(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    warmup: int,
    repeats: int,
    fences: Fences,
    slowdown: float = 0.0,
    paired: Callable[[], T] | None = None,
) -> tuple[list[Sample], torch.Tensor, float, list[T]]:
    """Warm-up generations (untimed), then `repeats` timed ones.

    `paired`, when given, is run after every warm-up and timed generation, outside the timing,
    and its results are returned: a reference measured right beside each sample, so that a
    host whose speed drifts moves both alike.

    Returns the samples, the last generation's tokens, the wall-clock time (epoch seconds) at
    which the timed generations began (from which the fixed cost of a test is derived) and the
    paired results of the timed phase.
    """
    tokens = torch.empty(0)
    for _ in range(warmup):
        _, tokens = timed_generation(model, prompt, max_new_tokens, fences)
        if paired is not None:
            paired()
    timed_from = time.time()
    samples: list[Sample] = []
    beside: list[T] = []
    for _ in range(repeats):
        sample, tokens = timed_generation(model, prompt, max_new_tokens, fences, slowdown)
        samples.append(sample)
        if paired is not None:
            beside.append(paired())
    return samples, tokens, timed_from, beside


# The reference is timed right after start-up (and, in a session's first test, right after the
# calibration), when the device and the host may still be speeding up: on 2 x H200 the first
# test's reference came out 1.3-1.7x slower than the same model timed in the next test. So it is
# repeated until it stops improving, and the median of that steady stretch is kept: a median,
# like the run's own figure, because on a noisy host the best repeat is a lucky one (a minimum
# made replicated runs look 20-50% slower than their reference on a 2 x H200 VM).
REFERENCE_MAX_REPEATS = 10
REFERENCE_PATIENCE = 3  # repeats in a row without a new best
REFERENCE_IMPROVEMENT = 0.02  # what counts as a new best


def steady_median(
    measure: Callable[[], float],
    patience: int = REFERENCE_PATIENCE,
    max_repeats: int = REFERENCE_MAX_REPEATS,
    improvement: float = REFERENCE_IMPROVEMENT,
) -> tuple[float, int]:
    """Repeat `measure()` until `patience` calls in a row have not bettered the best by more
    than `improvement` (or `max_repeats` calls); return the median of the last `patience` + 1
    calls (the best one and those after it, once steady) and the number of calls made."""
    if patience < 1 or max_repeats < patience:
        raise ValueError(f"need 1 <= patience <= max_repeats, got {patience}, {max_repeats}")
    values = [measure()]
    best, stale = values[0], 0
    while stale < patience and len(values) < max_repeats:
        value = measure()
        values.append(value)
        stale = 0 if value < best * (1 - improvement) else stale + 1
        best = min(best, value)
    return statistics.median(values[-(patience + 1) :]), len(values)


@torch.no_grad()
def reference_token_time(
    model: Callable[..., torch.Tensor], prompt: torch.Tensor, steps: int, sync: Callable[[], None]
) -> float:
    """Seconds per decode step of this rank's whole, unwrapped model: no collectives at all.

    The compute term of the performance model: it carries the eager-mode launch overhead and
    the real kernels of this device, which a bandwidth roofline would miss by ~4x.
    """
    local = Fences(sync=sync, barrier=lambda: None)
    timed_generation(model, prompt, steps, local)  # warm-up: allocator, kernels, caches
    steady, _ = steady_median(lambda: timed_generation(model, prompt, steps, local)[0].decode_s)
    return steady / max(steps - 1, 1)
