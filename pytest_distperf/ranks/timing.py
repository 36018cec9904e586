"""What is timed inside a rank: warm-up, then repeats of prefill + decode (or a test's own loop,
whose split is unknown), each between fences: a device sync and a barrier."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any, TypeVar

import torch
from distperf_model.generate import decode_one_token, prefill

from pytest_distperf.measured import Sample
from pytest_distperf.platform import platform_of
from pytest_distperf.ranks.hostspeed import host_times, thread_times
from pytest_distperf.ranks.reference import step_seconds

T = TypeVar("T")
# A user's generation loop: (model, prompt [B, T], max_new_tokens) -> tokens
GenerateFn = Callable[[Callable[..., torch.Tensor], torch.Tensor, int], Any]
# A strategy's own step (StrategyRecord.next_token): (model, idx, input_pos) -> token [B, 1]
NextTokenFn = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]
# Told where a phase of the built-in loop begins: "prefill", then "decode" before every step.
MarkFn = Callable[[str], None]


@dataclass(frozen=True)
class StepOverride:
    """Compiled replacements for the built-in loop's steps (None: as it is)."""

    prefill: NextTokenFn | None = None
    decode: NextTokenFn | None = None


@dataclass(frozen=True)
class Fences:
    """How to wait for the device and for the other ranks."""

    sync: Callable[[], None]
    barrier: Callable[[], None]


def device_sync(device: torch.device) -> Callable[[], None]:
    if platform_of(device.type).queues_kernels:
        return lambda: torch.cuda.synchronize(device)
    return lambda: None  # the host's ops are synchronous


@torch.no_grad()
def timed_generation(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    fences: Fences,
    slowdown: float = 0.0,
    generate: GenerateFn | None = None,
    next_token: NextTokenFn | None = None,
    steps: StepOverride | None = None,
) -> tuple[Sample, torch.Tensor]:
    """One generation, timed: the sample and the new tokens [B, max_new_tokens]. `next_token`
    replaces the built-in loop's sampling of the model's logits in every step."""
    args = (model, prompt, max_new_tokens, fences, generate, next_token, steps)
    (out, first), start, end, accounted = fenced(lambda: _generation(*args), fences, slowdown)
    if first is None:
        sample = Sample(total_s=end - start, ttft_s=None, decode_s=None, **accounted)
        return sample, _new_tokens(out, prompt, max_new_tokens)
    sample = Sample(total_s=end - start, ttft_s=first - start, decode_s=end - first, **accounted)
    return sample, torch.cat(out, dim=1)


def fenced(
    run: Callable[[], T], fences: Fences, slowdown: float = 0.0
) -> tuple[T, float, float, dict[str, float]]:
    """`run()` between fences: (its result, start, end, its thread's accounting). `slowdown`,
    the documented self-check knob, stretches it so the rate drops by that fraction, spinning
    as extra computation would (a sleep reads as a busy machine)."""
    fences.sync()
    fences.barrier()
    start, started = time.perf_counter(), thread_times()
    out = run()
    fences.sync()
    end = time.perf_counter()
    if slowdown:
        spin((end - start) * slowdown / (1.0 - slowdown))
        end = time.perf_counter()
    # The thread's wait for a core, and its time off the CPU by its own doing; {} where unknown.
    accounting, ended = {}, thread_times()
    if started is not None and ended is not None:
        ran_s, queued_s = ended[0] - started[0], ended[1] - started[1]
        accounting = {"queued_s": queued_s, "off_cpu_s": max(end - start - ran_s - queued_s, 0.0)}
    return out, start, end, accounting


@torch.no_grad()
def marked_generation(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    mark: MarkFn,
    generate: GenerateFn | None = None,
    next_token: NextTokenFn | None = None,
    steps: StepOverride | None = None,
) -> None:
    """One generation as the timed ones run it, untimed and unfenced, `mark` told where each
    phase begins (a user's loop: all "prefill")."""
    unfenced = Fences(sync=lambda: None, barrier=lambda: None)
    _generation(model, prompt, max_new_tokens, unfenced, generate, next_token, steps, mark)


def _generation(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    fences: Fences,
    generate: GenerateFn | None = None,
    next_token: NextTokenFn | None = None,
    steps: StepOverride | None = None,
    mark: MarkFn | None = None,
) -> tuple[Any, float | None]:
    """A user loop's output and None, or the built-in loop's new tokens ([B, 1] each) and the
    time the first one was ready; `steps` may replace its steps (compiled)."""
    if mark is not None:
        mark("prefill")
    if generate is not None:
        return generate(model, prompt, max_new_tokens), None
    batch, prompt_length = prompt.shape
    device = prompt.device
    first_step, step = (prefill, decode_one_token) if next_token is None else (next_token,) * 2
    if steps is not None:
        first_step, step = steps.prefill or first_step, steps.decode or step
    input_pos = torch.arange(prompt_length, device=device)
    token = first_step(model, prompt, input_pos)  # [B, 1]
    fences.sync()
    first = time.perf_counter()
    new_tokens = [token]
    # Built once and advanced on the device: a host-to-device copy per step would make the CPU
    # wait for the GPU every token and hide the launch overlap that eager decoding lives on.
    input_pos = torch.tensor([prompt_length], device=device)  # [1]
    for _ in range(max_new_tokens - 1):
        if mark is not None:
            mark("decode")
        token = step(model, token, input_pos)
        new_tokens.append(token)
        input_pos = input_pos + 1
    return new_tokens, first


def _new_tokens(out: Any, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """A user loop's tokens, the prompt included or not, as [B, max_new_tokens]."""
    tokens = torch.as_tensor(out)
    if tokens.dim() == 1:
        tokens = tokens.unsqueeze(0)
    batch, prompt_length = prompt.shape
    widths = (max_new_tokens, prompt_length + max_new_tokens)
    if tokens.dim() != 2 or tokens.shape[0] != batch or tokens.shape[1] not in widths:
        raise ValueError(
            f"distperf(generate=...) returned tokens of shape {tuple(tokens.shape)}; expected "
            f"[{batch}, {max_new_tokens}] (the new tokens) or [{batch}, {widths[1]}] (prompt "
            f"and new tokens): all {max_new_tokens} tokens, without stopping early"
        )
    return tokens[:, -max_new_tokens:]


def run_workload(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    warmup: int,
    repeats: int,
    fences: Fences,
    slowdown: float = 0.0,
    paired: Callable[[], T] | None = None,
    generate: GenerateFn | None = None,
    progress: Callable[[str], None] | None = None,
    next_token: NextTokenFn | None = None,
    steps: StepOverride | None = None,
    warmed: Callable[[], object] | None = None,
) -> tuple[list[Sample], torch.Tensor, float, list[T], HostTime]:
    """Warm-up generations (`warmed` called after each), then `repeats` timed ones: the samples,
    the last tokens, the epoch seconds the timed ones began, what `paired` returned right after
    each (outside the timing: a drifting host moves both alike) and this process's CPU, wait and
    steal in the timed generations alone."""
    tokens = torch.empty(0)
    say = progress or (lambda text: None)
    for done in range(warmup):
        say(f"warm-up {done + 1}/{warmup}")
        _, tokens = timed_generation(
            model, prompt, max_new_tokens, fences, 0.0, generate, next_token, steps
        )
        if warmed is not None:
            warmed()
    timed_from = time.time()
    samples: list[Sample] = []
    beside: list[T] = []
    host = HostTime(0.0, 0.0)
    for done in range(repeats):
        before = host_times()
        sample, tokens = timed_generation(
            model, prompt, max_new_tokens, fences, slowdown, generate, next_token, steps
        )
        host = host.plus(before, host_times())
        samples.append(sample)
        rate = prompt.shape[0] * max_new_tokens / sample.total_s
        say(f"repeat {done + 1}/{repeats}: {rate:.2f} tok/s (rank 0)")
        if paired is not None:
            beside.append(paired())
    return samples, tokens, timed_from, beside, host


@dataclass(frozen=True)
class HostTime:
    """This process's CPU seconds, run-queue wait and the host's steal per CPU over some
    stretch (None where unknown)."""

    cpu_s: float
    waited_s: float | None
    stolen_s: float | None = 0.0

    def plus(self, before: tuple[float | None, ...], after: tuple[float | None, ...]) -> HostTime:
        """This and the stretch between two `host_times()`."""
        return HostTime(*map(_added, astuple(self), before, after))

    def per(self, tokens: int) -> tuple[float | None, ...]:
        """(CPU, wait, steal) seconds per one of `tokens`."""
        return tuple(None if total is None else total / tokens for total in astuple(self))


def _added(total: float | None, before: float | None, after: float | None) -> float | None:
    if total is None or before is None or after is None:
        return None
    return total + max(after - before, 0.0)  # a thread may have ended


# Timed right after start-up, the reference may catch the device and host still speeding up
# (docs/benchmarks/h200-2026-11-29-overlap.md): repeated until it stops improving, the median of
# that steady stretch kept (on a noisy host the best repeat is a lucky one). A noisy host betters
# its best by chance: the cap keeps the reference a small share of the timed repeats.
REFERENCE_MAX_REPEATS = 6
REFERENCE_PATIENCE = 2  # repeats in a row without a new best
REFERENCE_IMPROVEMENT = 0.02  # what counts as a new best


def steady_median(
    measure: Callable[[], float],
    patience: int = REFERENCE_PATIENCE,
    max_repeats: int = REFERENCE_MAX_REPEATS,
    all_done: Callable[[bool], bool] = bool,
) -> tuple[float, int]:
    """Repeat `measure()` until `patience` calls in a row bettered no best (or `max_repeats`
    calls): the median of the last `patience` + 1 and the calls made. `all_done(done)`: whether
    every rank is done, so that all make as many calls (collectives in a forward pair up)."""
    values = [measure()]
    best, stale = values[0], 0
    while not all_done(stale >= patience or len(values) >= max_repeats):
        value = measure()
        values.append(value)
        stale = 0 if value < best * (1 - REFERENCE_IMPROVEMENT) else stale + 1
        best = min(best, value)
    return statistics.median(values[-(patience + 1) :]), len(values)


@torch.no_grad()
def reference_token_time(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    steps: int,
    sync: Callable[[], None],
    generate: GenerateFn | None = None,
    all_done: Callable[[bool], bool] = bool,
) -> tuple[float, float | None]:
    """(seconds per decode step, prefill seconds; None for a user's loop) of this rank's whole,
    unwrapped model: the eager launch overhead and real kernels a roofline misses."""
    local = Fences(sync=sync, barrier=lambda: None)
    prefills: list[float] = []

    def once() -> float:
        sample = timed_generation(model, prompt, steps, local, generate=generate)[0]
        if sample.ttft_s is not None:
            prefills.append(sample.ttft_s)
        return step_seconds(sample, steps)

    once()  # warm-up: allocator, kernels, caches
    prefills.clear()
    step_s = steady_median(once, all_done=all_done)[0]
    return step_s, statistics.median(prefills) if prefills else None


def spin(seconds: float) -> None:
    """Keep this process's CPU busy for `seconds` of wall time."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass
