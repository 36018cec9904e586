"""One test inside one rank, phase by phase: each a function of the test's RankContext that
sets its own fields (worker.PHASES lists them in order)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import astuple
from functools import partial
from typing import Any

import torch
from distperf_model.generate import make_prompt

from pytest_distperf.measured import Implementation, RankResult, Sample
from pytest_distperf.perfmodel.calibration import NO_MESSAGES, Calibration, MessageSizes
from pytest_distperf.ranks import allocator, counting, environment, memory
from pytest_distperf.ranks.collectives import in_step_seconds
from pytest_distperf.ranks.context import DTYPES, RankContext
from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.hostspeed import interpreter_loop_times
from pytest_distperf.ranks.models import build as build_model
from pytest_distperf.ranks.models import load_object, use_import_paths
from pytest_distperf.ranks.reference import choose_reference, times_before_wrapping
from pytest_distperf.ranks.strategies import BuildContext, rank_strategy
from pytest_distperf.ranks.timing import Fences, device_sync, reference_token_time, run_workload
from pytest_distperf.spec import PRECISION_BYTES, RunSpec
from pytest_distperf.strategies import get_strategy, message_sizes_for, strategy_names

FABRIC_PRECISION = {
    "fp32": "32-true",
    "bf16": "bf16-true",
    "fp16": "16-true",
    "bf16-mixed": "bf16-mixed",
}


def start(spec: RunSpec, progress: Callable[[str], None] | None) -> RankContext:
    """This rank's settings for the test and the strategy's two halves; nothing built yet."""
    fabric_module()  # imported before the test's import paths go in front of the rank's own
    platform = spec.platform
    if platform.shares_cores:
        torch.set_num_threads(spec.threads_per_rank)
    use_import_paths(spec.sys_path)  # before any of the user's modules is imported
    device = environment.rank_device(platform)
    if not platform.allocator_memory:
        allocator.keep_heap()  # a fresh or job rank's (a pool's ranks set it when they start)
    environment.forget_compiled_code()
    memory.reset_peak(device)  # a pooled rank has run other tests before this one
    record = get_strategy(spec.strategy)
    reason = record.unsupported(spec.accelerator, spec.devices)
    if reason:
        raise ValueError(reason)
    dtype, half = DTYPES[spec.workload.precision], rank_strategy(spec.strategy)
    return RankContext(spec, progress, device, platform, dtype, record, half)


def join(ctx: RankContext) -> None:
    """The run's process group, unless the launcher joined it already (the rank pool does)."""
    if ctx.spec.devices > 1 or "MASTER_ADDR" in os.environ:  # a launched job of one rank too
        environment.join_group(ctx.device)


def calibrate(ctx: RankContext) -> None:
    """Collectives at the session's sizes, before the model takes any memory."""
    if ctx.spec.calibration_sizes is not None and not ctx.spec.calibrate_model:
        _calibrate_outside_the_peak(ctx, model=False)


def build(ctx: RankContext) -> None:
    """The model, the same weights on every rank from the seed."""
    workload = ctx.workload
    ctx.model = build_model(workload, ctx.device, ctx.dtype, ctx.spec.test_dir)
    if workload.training:
        where = f"distperf(seq_length={workload.seq_length})"
        ctx.model.check_fits(workload.seq_length or 0, where)
        return
    ctx.model.check_fits(
        workload.prompt_length + max(workload.max_new_tokens, ctx.spec.reference_steps),
        f"distperf(prompt_length={workload.prompt_length}, "
        f"max_new_tokens={workload.max_new_tokens})",
    )


def calibrate_model(ctx: RankContext) -> None:
    """Collectives at every size any strategy would use for a builder's model, once built."""
    if ctx.spec.calibrate_model:
        _calibrate_outside_the_peak(ctx, model=True)


def check(ctx: RankContext) -> None:
    """The test's own generation loop, and what only a built model can refuse."""
    spec, workload = ctx.spec, ctx.workload
    if workload.generate:
        ctx.generate = load_object(workload.generate, f"distperf(generate={workload.generate!r})")
    unfit = ctx.record.check(ctx.model.shape, spec.devices)
    if unfit:  # a preset's or LitGPT name's model was refused at collection already
        raise ValueError(f"distperf(model={workload.model!r}): {unfit}")
    if ctx.generate is not None and ctx.record.decodes_across_ranks:
        raise ValueError(f"strategy {spec.strategy!r} decodes across ranks: no generate=")


def launch(ctx: RankContext) -> None:
    """Fabric with the strategy built for this model; it finds the process group joined."""
    spec, workload, model = ctx.spec, ctx.workload, ctx.model
    ctx.build_context = BuildContext(
        ctx.platform,
        spec.devices,
        wrap_units=model.units,
        rank=environment.global_rank(),
        tp_plan=workload.tp_plan,
        comm_delay_s=workload.comm_delay,
        training=workload.training,
    )
    fabric = fabric_module().Fabric(
        accelerator=spec.accelerator,
        devices=spec.devices // spec.nodes,
        num_nodes=spec.nodes,
        strategy=ctx.half.build(ctx.build_context),
        precision=FABRIC_PRECISION[workload.precision],
    )
    fabric.launch()
    if fabric.device != ctx.device:
        raise RuntimeError(f"Fabric placed this rank on {fabric.device}, not on {ctx.device}")
    ctx.fabric = fabric


def prompt(ctx: RankContext) -> None:
    """The generation's prompt, the same on every rank."""
    workload = ctx.workload
    batch, length = workload.batch_size, workload.prompt_length
    ctx.prompt = make_prompt(ctx.model.shape, batch, length, workload.seed, ctx.device)


def reference(ctx: RankContext) -> None:
    """The unwrapped model timed until steady where the reference is timed before wrapping
    (ranks/reference.py), and a collective between host-run layers (ranks/collectives.py)."""
    spec, workload, model, platform = ctx.spec, ctx.workload, ctx.model, ctx.platform
    steps, sharded = spec.reference_steps, ctx.record.sharded
    beside = ctx.record.measures_relative_speed(spec.relative_speed, spec.devices)
    ctx.bare_beside = bool(steps) and beside
    # Where memory is an RSS heap a preset's or LitGPT's whole copy is taken before wrapping (a
    # builder's is built again: its construction is the contract); it runs beside the repeats.
    copyable = not platform.allocator_memory and not workload.is_custom_builder
    ctx.copies_whole = ctx.bare_beside and sharded and copyable
    whole_beside = ctx.bare_beside and sharded and (copyable or _copy_fits(ctx))
    max_new = workload.max_new_tokens
    before = times_before_wrapping(sharded, ctx.bare_beside, max_new, steps, whole_beside)
    points = ctx.half.collective_points if not platform.queues_kernels and steps else None
    model.clear_caches()  # a builder's model may come with caches or rope buffers made
    if not before and points is None:
        return
    # The run's cache length at least: attention reads the whole static cache every step.
    length = workload.prompt_length + max(max_new, steps)
    model.setup_caches(workload.batch_size, length, device=ctx.device, dtype=ctx.dtype)
    sync, all_done = device_sync(ctx.device), environment.all_ranks_done(ctx.device)
    if before:
        args = (model.module, ctx.prompt, steps, sync, ctx.generate, all_done)
        ctx.before_wrap = reference_token_time(*args)
    if points is not None:
        args = (model.module, points, ctx.prompt, steps, sync, ctx.generate)
        ctx.in_step_s = in_step_seconds(*args)
    model.clear_caches()  # before wrapping: DDP would broadcast these buffers every forward


# What a whole copy built after wrapping needs free, in model sizes: itself with its KV cache,
# and as much again (ranks/bare.py keeps a copy only where that much stays free).
_COPY_NEEDS_MODELS = 2.5


def _copy_fits(ctx: RankContext) -> bool:
    """Whether a sharded model's whole copy, built once wrapping has freed all but this rank's
    shard, is expected to fit beside it (always, where memory is an RSS heap)."""
    if not ctx.platform.allocator_memory:
        return True
    module = ctx.model.module
    tensors = [*module.parameters(), *module.buffers()]
    model_bytes = sum(t.numel() * t.element_size() for t in tensors)
    free = torch.cuda.mem_get_info(ctx.device)[0]
    free_after_wrapping = free + model_bytes * (1 - 1 / ctx.spec.devices)
    return free_after_wrapping >= _COPY_NEEDS_MODELS * model_bytes


def wrap(ctx: RankContext) -> None:
    """The strategy's wrapper, then each rank's own caches (DDP would broadcast every forward the
    buffers it finds when it wraps)."""
    workload, model = ctx.workload, ctx.model
    ctx.wrapped = wrapped_in_strategy(ctx, model.module)
    length = workload.prompt_length + workload.max_new_tokens
    model.setup_caches(workload.batch_size, length, ctx.device, ctx.dtype, ctx.wrapped.module)


def wrapped_in_strategy(ctx: RankContext, module: Any) -> Any:
    """`module` in the strategy's wrapper (its own `wrap`, where Fabric only launched); the
    fences its timed calls run in."""
    ctx.fences = Fences(sync=device_sync(ctx.device), barrier=ctx.fabric.barrier)
    if ctx.half.wrap:
        return ctx.half.wrap(module, ctx.build_context)
    wrapped = ctx.fabric.setup_module(module)
    for name in ctx.model.forward_methods:  # what the test's own loop calls: DDP's forward too
        wrapped.mark_forward_method(name)
    return wrapped


def compile_steps(ctx: RankContext) -> None:
    """`distperf(compile=True)`'s steps, compiled and settled before the warm-up."""
    if not ctx.spec.compile:
        return
    from pytest_distperf.ranks.compiled import CompiledStep, compile_run

    if ctx.generate is not None:
        eager = "eager: the test's own generate= loop is timed as it is"
        ctx.wrapped_steps = CompiledStep(None, eager)
        return
    own_step = ctx.record.decodes_across_ranks
    ctx.dynamo_before = counting.dynamo_mark()  # this test's graph breaks come after
    ctx.wrapped_steps, ctx.bare.steps, ctx.compile_s = compile_run(
        ctx.wrapped,
        ctx.model.module,
        ctx.bare.module,
        ctx.prompt,
        device_sync(ctx.device),
        replicated=not ctx.record.sharded and not own_step,
        own_step=own_step,
    )


def time_generations(ctx: RankContext) -> None:
    """Warm-up, then the timed repeats; after each, the bare model's generation (where the
    relative speed is measured) and the host's own speed (hostspeed.py), outside the timing."""
    spec, workload, bare = ctx.spec, ctx.workload, ctx.bare
    if ctx.platform.allocator_memory:
        memory.reset_peak(ctx.device)
    bare_s: list[float] = []

    def beside(loop: bool = True) -> tuple[Sample | None, tuple[float, float] | None]:
        began = time.perf_counter()
        sample = bare.generation() if ctx.bare_beside else None
        host_loop = interpreter_loop_times() if loop else None
        bare_s.append(time.perf_counter() - began)
        return sample, host_loop

    began = time.time()
    samples, tokens, timed_from, besides, host = run_workload(
        ctx.wrapped,
        ctx.prompt,
        workload.max_new_tokens,
        spec.warmup,
        spec.repeats,
        ctx.fences,
        workload.slowdown,
        paired=beside,
        generate=ctx.generate,
        progress=ctx.progress,
        next_token=ctx.half.next_token,
        steps=ctx.wrapped_steps.override() if ctx.wrapped_steps else None,
        warmed=partial(beside, loop=False) if ctx.bare_beside else None,  # the bare one warms
    )
    ctx.samples, ctx.tokens, ctx.timed_from = samples, tokens, timed_from
    ctx.bare_samples = [s for s, _ in besides if s is not None]
    if len(ctx.bare_samples) < len(samples):
        ctx.bare_samples = []  # the copy was dropped during the run: no pairs to speak of
    in_warmup = sum(bare_s[: spec.warmup if ctx.bare_beside else 0])
    ctx.loop_s = {
        "warmup": timed_from - began - in_warmup,
        "timed": time.time() - timed_from - (sum(bare_s) - in_warmup),
        "bare": sum(bare_s),
    }
    new_tokens = spec.repeats * workload.batch_size * workload.max_new_tokens
    ctx.note_host([loop for _, loop in besides if loop is not None], host, new_tokens)


def pick_reference(ctx: RankContext) -> None:
    """The reference the run reports (ranks/reference.py)."""
    ctx.reference = choose_reference(
        ctx.record.sharded,
        ctx.workload.max_new_tokens,
        ctx.compiled_loop,
        ctx.bare_samples,
        ctx.after_samples,
        ctx.before_wrap,
        ctx.after_tokens,
    )


def memory_peak(ctx: RankContext) -> None:
    """The test's peak memory, the bare copy's own left out."""
    peak, kind = ctx.bare.reported_peak(*memory.peak(ctx.device))
    ctx.peak_memory = (max(peak, ctx.peak_floor), kind)


def count_work(ctx: RankContext) -> None:
    """One more generation, untimed, with this rank's work counted."""
    steps = ctx.wrapped_steps.override() if ctx.wrapped_steps else None
    counted_by(
        ctx,
        lambda: counting.count_work(
            ctx.wrapped,
            ctx.prompt,
            ctx.workload.max_new_tokens,
            generate=ctx.generate,
            next_token=ctx.half.next_token,
            steps=steps,
            compiled_since=ctx.dynamo_before if steps is not None else None,
        ),
    )


def counted_by(ctx: RankContext, count: Callable[[], counting.Counted]) -> None:
    """`count()`'s work unless counting is off; a failed count leaves the work unknown, and says
    so on stderr: it never fails a healthy run."""
    if not ctx.spec.count_work:
        return
    started = time.perf_counter()
    try:
        ctx.counted = count()
    except Exception as error:  # noqa: BLE001 - the run's timed figures stand without it
        rank = ctx.fabric.global_rank
        reason = f"counting the work failed, the run is reported without it: {error!r}"
        print(f"distperf: rank {rank}: {reason}", file=sys.stderr, flush=True)
    ctx.count_s = time.perf_counter() - started


def result(ctx: RankContext) -> None:
    """The rank's result, from what the phases before measured."""
    steps, chosen = ctx.wrapped_steps, ctx.reference
    ctx.result = RankResult(
        **common_result_fields(ctx),
        tokens=tuple(tuple(int(t) for t in row) for row in ctx.tokens.tolist()),
        reference_token_s=chosen.token_s,
        reference_source=chosen.source,
        bare_samples=tuple(ctx.bare_samples),
        compile_s=ctx.compile_s,
        compiled=steps.how if steps else "",
        cuda_graphs=bool(steps and steps.cuda_graphs),
        graph_breaks=bool(steps and steps.graph_breaks),
        reference_prefill_s=chosen.prefill_s,
        eager_reference=chosen.eager,
        device_time_per_token_s=ctx.counted.device_time_per_token_s if ctx.counted else None,
        in_step_collective_s=ctx.in_step_s,
    )


def common_result_fields(ctx: RankContext) -> dict[str, Any]:
    """The RankResult fields every mode reports."""
    fabric, counted = ctx.fabric, ctx.counted
    fabric_strategy, sharding, wrapper = ctx.half.describe_implementation(fabric, ctx.wrapped)
    peak, memory_kind = ctx.peak_memory
    dist = torch.distributed
    backend = str(dist.get_backend()) if dist.is_initialized() else ""  # "": one process alone
    return {
        "rank": fabric.global_rank,
        "samples": tuple(ctx.samples),
        "peak_memory_bytes": peak,
        "memory_kind": memory_kind,
        "implementation": Implementation(fabric_strategy, sharding, backend, wrapper),
        "versions": environment.software_versions(),
        "device_name": environment.device_name(ctx.device),
        "replicas": ctx.record.replicas(fabric.world_size),
        "timed_from": ctx.timed_from,
        "host_loop_s": ctx.host_loop_s,
        "host_loop_cpu_s": ctx.host_loop_cpu_s,
        "calibration": ctx.calibration,
        "model_shape": ctx.model.shape,
        "count_s": ctx.count_s,
        "work": counted.work if counted else None,
        "host_cpu_per_token_s": ctx.host_cpu_per_token_s,
        "run_queue_wait_per_token_s": ctx.run_queue_wait_per_token_s,
        "steal_per_token_s": ctx.steal_per_token_s,
    }


def _calibrate_outside_the_peak(ctx: RankContext, model: bool) -> None:
    """Calibrate inside the test (`model`: at every size any strategy would use for it): its
    buffers are not the test's memory, so the peak so far stays as a floor and a new one starts."""
    ctx.peak_floor = max(ctx.peak_floor, memory.peak(ctx.device)[0])
    own = NO_MESSAGES
    if model:
        dtype_bytes, batch = PRECISION_BYTES[ctx.workload.precision], ctx.workload.batch_size
        names, devices = strategy_names(), ctx.spec.devices
        own = message_sizes_for(ctx.model.shape, names, devices, dtype_bytes, batch)
    ctx.calibration = calibrated(ctx, own, ctx.dtype)
    memory.reset_peak(ctx.device)


def calibrated(ctx: RankContext, own: MessageSizes, dtype: torch.dtype) -> Calibration:
    """Collectives at the session's sizes and `own`, up to the platform's largest."""
    from pytest_distperf.ranks.calibrate import calibrate

    session = ctx.spec.calibration_sizes or NO_MESSAGES
    union = (tuple(sorted({*a, *b})) for a, b in zip(astuple(session), astuple(own), strict=True))
    sizes = MessageSizes(*union).up_to(ctx.platform.calibration_max_bytes)
    return calibrate(sizes.all_gather, sizes.all_reduce, ctx.device, dtype, sizes_p2p=sizes.p2p)
