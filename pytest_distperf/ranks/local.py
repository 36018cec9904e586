"""A rank's own decode, measured the way decode runs it, after the timed repeats (CPU ranks,
and a CUDA run on one device, where no collective crosses a link; docs/perfmodel.md, "Measured
in the ranks"):

* the wrapped model's generation with its collectives skipped: this rank's share of the
  compute with the wrapper's hooks and dispatch, in turn with the bare whole model, so that
  their ratio holds where the host's speed drifts; each with the steps of the timed repeats
  (a compiled run's compiled ones), the host's loop after each pair;
* the same generation with its collectives, back to back with no barrier per step (mean): on
  cores that the ranks and the backend's threads share, a collective between compute bursts
  costs what a fenced calibration never sees (the waits for the peer and for a core, and the
  compute slowed around them; docs/benchmarks/cpu-2026-12-02-predictions.md).

The knobs stay out: the slow-down spins only in the timed repeats and comm_delay's sleeps are
paused here, so a slowed run is predicted as a healthy one. Only torch.distributed's Python
calls are skipped (the by-hand tp split, the pipeline's hops, FSDP2, DDP); a DTensor plan's
functional collectives still run, and are then part of its compute.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple
from unittest import mock

import torch
import torch.distributed as dist
from distperf_model.parallelize import comm_delays_paused

from pytest_distperf.ranks.hostspeed import host_times, interpreter_loop_times
from pytest_distperf.ranks.reference import step_seconds
from pytest_distperf.ranks.timing import (
    Fences,
    GenerateFn,
    NextTokenFn,
    StepOverride,
    timed_generation,
)
from pytest_distperf.spec import Sample

LOCAL_DECODE_STEPS = 4  # a warm decode step repeats the same work: a few give its time
WITH_COLLECTIVES_REPEATS = 4  # at most; the mean of their steps
BUDGET_S = 0.5  # fewer repeats where one generation takes longer than this share


class PairPlan(NamedTuple):
    """Wrapped and bare generations in turn: at most `most` pairs, as many as fit in
    `budget_s` after a first generation of each."""

    most: int
    budget_s: float


# A larger model's generation takes a good part of a second on a CPU rank: half a second held
# two pairs, whose slowest rank's share read noise as a slower wrapper
# (docs/benchmarks/cpu-2026-12-03-predictions.md).
CPU_PAIRS = PairPlan(most=3, budget_s=1.5)
# One GPU's eager decode is host-bound and drifts between generations: more pairs, in a longer
# budget than the 2-core CPU suite can afford (docs/benchmarks/h200-2026-12-03-share.md).
DEVICE_PAIRS = PairPlan(most=7, budget_s=4.0)


class Runner(NamedTuple):
    """A model as the timed repeats run it: its sampling (None: the built-in one) and its
    compiled steps (None: eager)."""

    model: Any
    next_token: NextTokenFn | None
    steps: StepOverride | None


def _unfenced(sync: Callable[[], None]) -> Fences:
    """No barrier: each rank runs as decode lets it; `sync` waits for this rank's device."""
    return Fences(sync=sync, barrier=lambda: None)


@dataclass(frozen=True)
class LocalTimes:
    """What `measure` found on this rank; None where it could not be measured."""

    step_s: float | None  # wrapped, collectives skipped: seconds per decode step
    prefill_s: float | None
    bare_step_s: float | None  # the bare whole model, in turn with it
    bare_prefill_s: float | None
    # The wrapped decode step with its collectives (0 where it issues none), and the step
    # without them that it adds to (this rank's step_s).
    replay_step_s: float | None
    replay_compute_s: float | None
    # Seconds per new token its threads waited runnable for a core in that run: the ranks' own
    # oversubscription, which the prediction now holds (never a neighbour's "machine busy").
    run_queue_wait_s: float | None
    # The host's loop (ranks/hostspeed.py) after each pair, median wall seconds: the host's
    # speed while the pairs ran, as the timed repeats' loop is theirs.
    host_loop_s: float | None = None
    # The bare model's steps replayed as CUDA graphs: the device's time, which host drift does
    # not scale (the prediction then adds the wrapper's excess to it).
    bare_cuda_graphs: bool = False


def _done_work() -> Any:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(None)
    return torch._C._distributed_c10d._create_work_from_future(future)


def _stubs(timeline: list[str]) -> dict[str, Callable[..., Any]]:
    """torch.distributed's collectives as no-ops that note what they were asked."""

    def done(async_op: bool) -> Any:
        return _done_work() if async_op else None

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        timeline.append("all_reduce")
        return done(async_op)

    def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                               async_op: bool = False) -> Any:  # fmt: skip
        timeline.append("all_gather")
        return done(async_op)

    def reduce_scatter_tensor(output: Any, input: Any, op: Any = None, group: Any = None,
                              async_op: bool = False) -> Any:  # fmt: skip
        timeline.append("reduce_scatter")
        return done(async_op)

    def broadcast(tensor: Any, src: Any = None, group: Any = None, async_op: bool = False,
                  **kwargs: Any) -> Any:  # fmt: skip
        timeline.append("broadcast")
        return done(async_op)

    def send(tensor: Any, dst: Any = None, *args: Any, **kwargs: Any) -> None:
        timeline.append("send")

    def recv(tensor: Any, src: Any = None, *args: Any, **kwargs: Any) -> int:
        tensor.zero_()  # a token id that indexes the embedding; nothing else reads it
        timeline.append("recv")
        return 0 if src is None else int(src)

    def isend(tensor: Any, dst: Any = None, *args: Any, **kwargs: Any) -> Any:
        send(tensor, dst)
        return _done_work()

    def irecv(tensor: Any, src: Any = None, *args: Any, **kwargs: Any) -> Any:
        recv(tensor, src)
        return _done_work()

    return {
        "all_reduce": all_reduce,
        "all_gather_into_tensor": all_gather_into_tensor,
        "all_gather_single": all_gather_into_tensor,  # FSDP2's
        "reduce_scatter_tensor": reduce_scatter_tensor,
        "reduce_scatter_single": reduce_scatter_tensor,
        "broadcast": broadcast,
        "send": send,
        "recv": recv,
        "isend": isend,
        "irecv": irecv,
    }


@contextmanager
def collectives_skipped(timeline: list[str]) -> Iterator[None]:
    """Within: torch.distributed's collectives do nothing but note themselves in `timeline`;
    the comm_delay knob's sleeps are paused."""
    from torch.distributed import distributed_c10d

    with ExitStack() as stack:
        stack.enter_context(comm_delays_paused())
        for name, stub in _stubs(timeline).items():
            for module in (dist, distributed_c10d):
                if hasattr(module, name):  # a torch without one has callers without it
                    stack.enter_context(mock.patch.object(module, name, stub))
        yield


@torch.no_grad()
def measure(
    wrapped: Any,
    bare: Any,
    prompt: torch.Tensor,
    max_new_tokens: int,
    all_done: Callable[[bool], bool],
    generate: GenerateFn | None = None,
    next_token: NextTokenFn | None = None,
    sync: Callable[[], None] = lambda: None,
    plan: PairPlan = CPU_PAIRS,
    steps: StepOverride | None = None,
    bare_steps: StepOverride | None = None,
    bare_cuda_graphs: bool = False,
) -> LocalTimes | None:
    """This rank's own decode (collectives skipped, `bare` in turn with it where given), then
    with its collectives, which every rank runs or none does; None where the own decode
    failed (said on stderr: the run's timed figures stand without it). `sync` waits for the
    rank's device (CUDA) before and after each timed generation; `plan`: how many wrapped and
    bare generations in turn; `steps` / `bare_steps`: the compiled steps each runs in the timed
    repeats (None: eager), so that a compiled run's share is the compiled wrapper's;
    `bare_cuda_graphs`: whether `bare_steps` replay as CUDA graphs."""
    tokens = 1 + min(max_new_tokens - 1, LOCAL_DECODE_STEPS)
    timeline: list[str] = []  # the kinds of collectives skipped
    fences = _unfenced(sync)
    own_run, bare_run = Runner(wrapped, next_token, steps), Runner(bare, None, bare_steps)
    try:
        with collectives_skipped(timeline):
            own = _alternating(own_run, bare_run, prompt, tokens, fences, generate, plan)
    except Exception as error:  # noqa: BLE001 - a measurement beside the run, never its verdict
        print(f"distperf: the rank's own decode was not measured: {error!r}", file=sys.stderr)
        all_done(False)  # the peers wait for this rank's answer before the collectives
        return None
    times, loop_s = own
    if not all_done(bool(timeline)):  # no collective at all: nothing adds to the compute
        return LocalTimes(*times, 0.0, times[0], None, loop_s, bare_cuda_graphs)
    with comm_delays_paused():
        with_collectives, waited = _with_collectives(
            own_run, prompt, tokens, fences, generate, max_new_tokens
        )
    return LocalTimes(*times, with_collectives, times[0], waited, loop_s, bare_cuda_graphs)


def _generation(
    runner: Runner,
    prompt: torch.Tensor,
    tokens: int,
    fences: Fences,
    generate: GenerateFn | None,
) -> Sample:
    model, next_token, steps = runner
    return timed_generation(
        model, prompt, tokens, fences, generate=generate, next_token=next_token, steps=steps
    )[0]


def _repeats(most: int, first: Sample, budget_s: float = BUDGET_S) -> int:
    """As many repeats as fit in `budget_s` after a first generation, one at least."""
    return max(1, min(most, int(budget_s / max(first.total_s, 1e-9))))


def _alternating(
    wrapped: Runner,
    bare: Runner,
    prompt: torch.Tensor,
    tokens: int,
    fences: Fences,
    generate: GenerateFn | None,
    plan: PairPlan,
) -> tuple[tuple[float, float | None, float | None, float | None], float]:
    """(step, prefill) of the wrapped model and of the bare one (None without it), medians of
    as many as `plan` allows each, run in turn after one warm-up each; and the host's loop
    after each pair (median wall seconds)."""
    runs: dict[str, list[Sample]] = {"wrapped": [], "bare": []}
    candidates = (("wrapped", wrapped), ("bare", bare))
    models = [(name, runner) for name, runner in candidates if runner.model is not None]
    first = [_generation(runner, prompt, tokens, fences, generate) for _, runner in models]
    loops = []
    for _ in range(_repeats(plan.most, first[0], plan.budget_s)):
        for name, runner in models:
            runs[name].append(_generation(runner, prompt, tokens, fences, generate))
        loops.append(interpreter_loop_times()[0])
    steps = {k: [step_seconds(s, tokens) for s in v] for k, v in runs.items()}
    prefills = {k: [s.ttft_s for s in v if s.ttft_s is not None] for k, v in runs.items()}
    times = (
        statistics.median(steps["wrapped"]),
        _median(prefills["wrapped"]),
        _median(steps["bare"]),
        _median(prefills["bare"]),
    )
    return times, statistics.median(loops)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _with_collectives(
    runner: Runner,
    prompt: torch.Tensor,
    tokens: int,
    fences: Fences,
    generate: GenerateFn | None,
    max_new_tokens: int,
) -> tuple[float, float | None]:
    """Mean seconds per decode step of the wrapped model with its collectives, and its threads'
    wait for a core per new token (None where the kernel keeps none), generations back
    to back after one barrier (the ranks then drift as decode lets them). As long as the timed
    ones where that fits in BUDGET_S (a generation's first steps cost more: a short one would
    weigh them more), else short; every rank runs as many as the slowest rank's allow."""
    first = _generation(runner, prompt, tokens, fences, generate)
    whole = first.total_s * max_new_tokens / tokens
    most = WITH_COLLECTIVES_REPEATS
    long = min(most, int(BUDGET_S / max(whole, 1e-9)))  # 0: a whole one does not fit
    plan = torch.tensor([_repeats(most, first), long])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(plan, op=dist.ReduceOp.MIN)  # the same plan on every rank
    count, length = (int(plan[1]), max_new_tokens) if plan[1] else (int(plan[0]), tokens)
    before = host_times()
    samples = [_generation(runner, prompt, length, fences, generate) for _ in range(count)]
    after = host_times()
    waited = None
    if before[1] is not None and after[1] is not None:
        waited = max(after[1] - before[1], 0.0) / (count * length * prompt.shape[0])
    return statistics.fmean(step_seconds(s, length) for s in samples), waited
