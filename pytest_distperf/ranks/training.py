"""The phases of `distperf(mode="train")` in one rank and the step they time (forward, loss,
backward, AdamW on the rank's own random batch); docs/training.md."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from pytest_distperf.measured import RankResult, Sample
from pytest_distperf.perfmodel.train import model_flops_per_step
from pytest_distperf.platform import Platform
from pytest_distperf.ranks import allocator, counting, environment, memory, phases
from pytest_distperf.ranks.context import RankContext, TrainState
from pytest_distperf.ranks.hostspeed import host_times, interpreter_loop_times
from pytest_distperf.ranks.models import build
from pytest_distperf.ranks.probes import Timer, median_time
from pytest_distperf.ranks.timing import Fences, HostTime, device_sync, fenced, steady_median
from pytest_distperf.spec import COMM_BYTES, PRECISION_BYTES
from pytest_distperf.strategies import train_message_sizes_for

# AdamW's real arithmetic, without moving far from the seed's weights: every repeat's work alike.
LEARNING_RATE = 1e-4
WHOLE_STEP = "the whole model's step timed until steady before wrapping"
BESIDE_STEP = "the whole model's step beside each timed step"
# A CPU warm-up goes on until no rank's heap grew (by GROWN_PAGES: more than the interpreter's
# own) in SETTLED_STEPS steps in a row, at most MAX_SETTLING steps beyond the warm-up asked for.
SETTLED_STEPS = 2
MAX_SETTLING = 20
GROWN_PAGES = 1024
# The whole model's step alone after the first: timed until it stops improving, a small share.
REFERENCE_PATIENCE = 1
REFERENCE_STEPS = 3
# Free heap a CPU rank adds before its timed steps (a quarter of what its warm-up grew, at least
# this): the steps' allocations land in another order from step to step.
MIN_HEAP_PAD = 64 << 20

Step = Callable[[], torch.Tensor]


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of [B, T, V] logits against [B, T] next tokens, in float32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def matmul_rate(device: torch.device, platform: Platform, dtype: torch.dtype) -> tuple[float, str]:
    """(FLOP/s, how it was measured) of a square matmul in `dtype` on this rank's device,
    with every other rank measuring at the same time: the rate the ranks reach together."""
    n = platform.matmul_size
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    alone = Timer(sync=device_sync(device), barrier=lambda: None, agree=float)
    # Two warm-up calls (kernels chosen, clocks up); every repeat timed, however long.
    seconds = median_time(partial(torch.mm, a, b), alone, 2, platform.matmul_repeats, math.inf)
    threads = f", {torch.get_num_threads()} thread(s)" if platform.shares_cores else ""
    kind = str(dtype).removeprefix("torch.")
    how = f"measured: {n}x{n} {kind} matmul on {environment.device_name(device)}{threads}"
    return 2 * n**3 / seconds, how


def calibrate(ctx: RankContext) -> None:
    """Collectives at the sizes a training step of this model moves, and the matmul rate."""
    workload, spec = ctx.workload, ctx.spec
    sizes = train_message_sizes_for(
        ctx.model.shape,
        spec.strategy,
        spec.devices,
        PRECISION_BYTES[workload.precision],
        COMM_BYTES[workload.precision],
        workload.batch_size,
        workload.seq_length or 0,
    )
    # The matmuls run in bfloat16 under bf16-mixed's autocast.
    dtype = torch.bfloat16 if workload.precision == "bf16-mixed" else ctx.dtype
    # With the session's sizes, when this pool has none yet.
    if spec.devices > 1 and (spec.calibrate_model or spec.calibration_sizes is not None):
        if not ctx.platform.allocator_memory:  # the reference's reset gives it back
            allocator.fault_in_heap(allocator.CALIBRATION_PAD)
        ctx.calibration = phases.calibrated(ctx, sizes, dtype)
    rate, how = matmul_rate(ctx.device, ctx.platform, dtype)
    # This data-parallel rank's random tokens, drawn on the CPU: every device draws the same.
    world = max(spec.devices, 1)
    dp_rank = environment.global_rank() // max(world // ctx.record.replicas(world), 1)
    generator = torch.Generator().manual_seed(workload.seed + dp_rank)
    shape = (workload.batch_size, (workload.seq_length or 0) + 1)
    tokens = torch.randint(0, ctx.model.shape.vocab_size, shape, generator=generator)  # [B, T+1]
    tokens = tokens.to(ctx.device)
    ctx.train = TrainState(
        tokens[:, :-1], tokens[:, 1:], matmul_flops_per_s=rate, matmul_source=how
    )


def check(ctx: RankContext) -> None:
    """What only a built model can refuse (a strategy that cannot train was refused at
    collection already)."""
    if ctx.record.train_refusal:
        raise ValueError(f"strategy {ctx.spec.strategy!r} cannot train: {ctx.record.train_refusal}")
    unfit = ctx.record.check(ctx.model.shape, ctx.spec.devices)
    if unfit:
        raise ValueError(f"distperf(model={ctx.workload.model!r}): {unfit}")


def steps_beside(ctx: RankContext) -> bool:
    """Whether a whole copy steps beside each timed step (its median: the compute term): on CPU
    ranks, whose host drifts between a step timed before wrapping and the timed ones; not
    compiled (the copy is eager); after a warm-up (the copy is built once its peak was read)."""
    spec = ctx.spec
    cpu = not ctx.platform.allocator_memory
    return cpu and not spec.compile and spec.devices > 1 and spec.warmup > 0


def reference(ctx: RankContext) -> None:
    """The whole model's step before wrapping, at learning rate 0: the loss the wrapped model
    must reproduce and, unless a copy steps beside the timed ones, the compute term; none where
    it and its optimizer do not fit."""
    train = ctx.train
    step, optimizer = _step_alone(ctx, ctx.model.module)
    try:
        train.reference_loss = float(step())  # and the warm-up: AdamW's state, the allocator
        if steps_beside(ctx):
            return
        all_done = environment.all_ranks_done(ctx.device)
        once = partial(_seconds_alone, step, ctx.device)
        train.reference_step_s = steady_median(
            once, REFERENCE_PATIENCE, REFERENCE_STEPS, all_done=all_done
        )[0]
    except torch.OutOfMemoryError:
        train.reference_loss = train.reference_step_s = None  # the model's FLOPs stand in
    finally:
        optimizer.zero_grad(set_to_none=True)
        del optimizer
        if ctx.platform.allocator_memory:
            torch.cuda.empty_cache()
        memory.reset_peak(ctx.device)  # the run's peak is the wrapped model's, not this one's


def wrap(ctx: RankContext) -> None:
    """The strategy's wrapper through Fabric (compiled first with compile=True: Fabric compiles
    the wrapped module again), then AdamW over what each rank holds."""
    module = ctx.model.module
    module.train()
    if ctx.spec.compile:
        module = torch.compile(module)
    ctx.wrapped = phases.wrapped_in_strategy(ctx, module)
    optimizer = torch.optim.AdamW(ctx.wrapped.parameters(), lr=LEARNING_RATE)
    ctx.train.optimizer = ctx.fabric.setup_optimizers(optimizer)


def time_steps(ctx: RankContext) -> None:
    """Warm-up steps, then the timed ones, each fenced like a generation; the first step's loss
    and the host's own speed after each step, outside the timing."""
    spec, train = ctx.spec, ctx.train
    step = _step(ctx, ctx.wrapped, train.optimizer)
    say = ctx.progress or (lambda text: None)
    began, resident = time.time(), memory.resident()
    whole, built_s = None, 0.0
    if _warm_up(ctx, step, say) and not ctx.platform.allocator_memory:
        # The steps' own peak; the whole copy after it (not in it); then a heap the steps will
        # not fault in again (ranks/allocator.py).
        ctx.peak_memory = memory.peak(ctx.device)
        built = time.time()
        whole = _whole_step(ctx) if steps_beside(ctx) else None
        built_s = time.time() - built
        grown = ctx.peak_memory[0] - resident if resident is not None else 0
        allocator.fault_in_heap(max(MIN_HEAP_PAD, grown // 4))
    ctx.timed_from = time.time()
    host = HostTime(0.0, 0.0)
    loops, beside_steps = [], []
    for done in range(spec.repeats):
        before = host_times()
        sample, loss = _timed(step, ctx.fences, ctx.workload.slowdown)
        host = host.plus(before, host_times())
        if train.loss is None:
            train.loss = float(loss)
        ctx.samples.append(sample)
        say(f"step {done + 1}/{spec.repeats}: {sample.total_s * 1e3:.1f} ms (rank 0)")
        if whole is not None:
            beside_steps.append(_seconds_alone(whole, ctx.device))
        loops.append(interpreter_loop_times())
    if beside_steps:
        train.reference_step_s = statistics.median(beside_steps)
    beside_s = sum(beside_steps)
    ctx.loop_s = {
        "warmup": ctx.timed_from - began - built_s,
        "timed": time.time() - ctx.timed_from - beside_s,
        "bare": built_s + beside_s,
    }
    tokens = spec.repeats * ctx.workload.batch_size * (ctx.workload.seq_length or 0)
    ctx.note_host(loops, host, tokens)


def _warm_up(ctx: RankContext, step: Step, say: Callable[[str], None]) -> int:
    """`spec.warmup` steps, and with an RSS heap more until it settles (a step that grows the
    heap page-faults in what it grows: ranks/allocator.py); the steps run."""
    spec, train = ctx.spec, ctx.train
    settling = not ctx.platform.allocator_memory and spec.warmup > 0
    all_done = environment.all_ranks_done(ctx.device) if settling else bool
    done = quiet = 0
    while done < spec.warmup or settling:
        before = allocator.minor_faults()
        loss = _timed(step, ctx.fences, 0.0)[1]
        grew = allocator.minor_faults() - before > GROWN_PAGES
        quiet = 0 if grew else quiet + 1
        done += 1
        if train.loss is None:
            train.loss = float(loss)
        say(f"warm-up step {done}" + (" (the heap grew)" if grew else ""))
        if settling and done >= spec.warmup:
            settled = quiet >= SETTLED_STEPS or done >= spec.warmup + MAX_SETTLING
            settling = not all_done(settled)
    return done


def memory_peak(ctx: RankContext) -> None:
    """The wrapped steps' peak: weights, gradients, optimizer state and activations (on CPU
    read after the warm-up, before the heap was padded)."""
    if not ctx.peak_memory[1]:
        ctx.peak_memory = memory.peak(ctx.device)


def count_step(ctx: RankContext) -> None:
    """One more step, untimed, with its work counted."""
    step = _step(ctx, ctx.wrapped, ctx.train.optimizer)
    phases.counted_by(ctx, lambda: counting.count_step(step, ctx.platform.queues_kernels))


def result(ctx: RankContext) -> None:
    """The rank's result: the fields every mode has, and a training run's own."""
    train, workload = ctx.train, ctx.workload
    flops = model_flops_per_step(ctx.model.shape, workload.batch_size, workload.seq_length or 0)
    source = BESIDE_STEP if steps_beside(ctx) else WHOLE_STEP
    ctx.result = RankResult(
        **phases.common_result_fields(ctx),
        tokens=(),
        compiled="torch.compile of the model" if ctx.spec.compile else "",
        loss=train.loss,
        reference_loss=train.reference_loss,
        reference_step_s=train.reference_step_s,
        reference_source=source if train.reference_step_s is not None else "",
        matmul_flops_per_s=train.matmul_flops_per_s,
        matmul_source=train.matmul_source,
        model_flops_per_step=flops,
    )


def _step(ctx: RankContext, module: Any, optimizer: Any, wrapped: bool = True) -> Step:
    """One optimizer step of `module` on this rank's batch, returning the loss (not synchronised):
    the model's own loss where it has one (a transformers model's). A whole model alone runs
    under Fabric's autocast; its wrapper runs its own, and Fabric's backward."""
    train, fabric = ctx.train, ctx.fabric
    # Read from the model itself: a method read through Fabric's wrapper is tracked each call.
    own_loss = getattr(getattr(module, "module", module), "next_token_loss", None)
    loss_of = own_loss if callable(own_loss) else next_token_loss
    autocast = nullcontext if wrapped else fabric.autocast
    backward = fabric.backward if wrapped else torch.Tensor.backward

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            logits = module(train.inputs)  # [B, T, V]
        loss = loss_of(logits, train.targets)
        backward(loss)
        optimizer.step()
        return loss.detach()

    return step


def _step_alone(ctx: RankContext, module: torch.nn.Module) -> tuple[Step, Any]:
    """(step, its AdamW) of a whole, unwrapped `module` at learning rate 0: the weights kept."""
    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.0)
    return _step(ctx, module, optimizer, wrapped=False), optimizer


def _whole_step(ctx: RankContext) -> Step:
    """The step of a whole copy built again from the seed, warmed once (its AdamW state and heap
    made before the timed steps)."""
    copy = build(ctx.workload, ctx.device, ctx.dtype, ctx.spec.test_dir)
    step, _ = _step_alone(ctx, copy.module)
    step()
    return step


def _seconds_alone(step: Step, device: torch.device) -> float:
    _, start, end, _ = fenced(step, Fences(sync=device_sync(device), barrier=lambda: None))
    return end - start


def _timed(step: Step, fences: Fences, slowdown: float) -> tuple[Sample, torch.Tensor]:
    loss, start, end, accounted = fenced(step, fences, slowdown)
    return Sample(total_s=end - start, ttft_s=None, decode_s=None, **accounted), loss
