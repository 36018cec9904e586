"""Runs inside one rank: model -> Fabric strategy -> timed generations -> RankResult.

The launcher starts this in fresh processes with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT already set, so Fabric sees an externally launched job and never re-runs pytest.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import platform
import signal
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from distperf_model.generate import make_prompt

from pytest_distperf.perfmodel.calibration import MessageSizes, message_sizes
from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.ranks import memory
from pytest_distperf.ranks.fabric import fabric_module, fabric_version
from pytest_distperf.ranks.hostspeed import interpreter_loop_seconds
from pytest_distperf.ranks.models import build, load_object, use_import_paths
from pytest_distperf.ranks.timing import (
    Fences,
    device_sync,
    reference_token_time,
    run_workload,
    step_seconds,
    timed_generation,
)
from pytest_distperf.spec import (
    PRECISION_BYTES,
    Implementation,
    RankResult,
    RunSpec,
    Sample,
    Workload,
)
from pytest_distperf.strategies import BuildContext, get_strategy, strategy_names

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FABRIC_PRECISION = {"fp32": "32-true", "bf16": "bf16-true", "fp16": "16-true"}


def run_rank(spec: RunSpec, progress: Callable[[str], None] | None = None) -> RankResult:
    """Entry point of every rank (must stay a module-level function: it is pickled).

    `progress`: where the timing loop reports warm-up and repeats (rank 0 of a pool only)."""
    # A hung collective never returns to Python, so the watchdog lives in faulthandler's C
    # thread: at the deadline it writes every thread's stack to stderr and exits the rank.
    faulthandler.dump_traceback_later(spec.timeout, exit=True, file=sys.stderr)
    # When another rank fails or times out, the launcher stops this one with SIGTERM: leave its
    # stack behind too, so a hang shows where every rank was.
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    try:
        return _run(spec, progress)
    finally:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.unregister(signal.SIGTERM)


def _run(spec: RunSpec, progress: Callable[[str], None] | None = None) -> RankResult:
    Fabric = fabric_module().Fabric

    if spec.accelerator == "cpu":
        torch.set_num_threads(spec.threads_per_rank)
    workload = spec.workload
    use_import_paths(spec.sys_path)  # before any of the user's modules is imported
    device = _rank_device(spec.accelerator)
    _forget_compiled_code()
    memory.reset_peak(device)  # a pooled rank has run other tests before this one
    record = get_strategy(spec.strategy)
    reason = record.unsupported(spec.accelerator, spec.devices)
    if reason:
        raise ValueError(reason)
    dtype = DTYPES[workload.precision]
    if spec.devices > 1 or "MASTER_ADDR" in os.environ:  # a launched job of one rank too
        _join_group(device)
    calibration = None
    if spec.calibration_sizes is not None and not spec.calibrate_model:
        calibration = _calibrate(spec, None, device, dtype)
    # Every rank builds the same weights from the seed; sharded strategies then keep their shard.
    model = build(workload, device, dtype)
    model.check_fits(
        workload.prompt_length + max(workload.max_new_tokens, spec.reference_steps),
        f"distperf(prompt_length={workload.prompt_length}, "
        f"max_new_tokens={workload.max_new_tokens})",
    )
    if spec.calibrate_model:  # a builder's message sizes are known only now
        calibration = _calibrate(spec, model.shape, device, dtype)
    generate = None
    if workload.generate:
        generate = load_object(workload.generate, f"distperf(generate={workload.generate!r})")
    unfit = record.check(model.shape, spec.devices)
    if unfit:  # a preset's or LitGPT name's model was refused at collection already
        raise ValueError(f"distperf(model={workload.model!r}): {unfit}")
    if generate is not None and record.next_token is not None:
        raise ValueError(f"strategy {spec.strategy!r} decodes across ranks: no generate=")
    # The strategy is built for this model: FSDP wraps (or shards) each of its shard units.
    context = BuildContext(
        spec.accelerator,
        spec.devices,
        wrap_units=model.units,
        rank=torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
        tp_plan=workload.tp_plan,
        comm_delay_s=workload.comm_delay,
    )
    fabric = Fabric(
        accelerator=spec.accelerator,
        devices=spec.devices // spec.nodes,
        num_nodes=spec.nodes,
        strategy=record.build(context),
        precision=FABRIC_PRECISION[workload.precision],
    )
    fabric.launch()  # finds the process group already joined
    if fabric.device != device:
        raise RuntimeError(f"Fabric placed this rank on {fabric.device}, not on {device}")
    if spec.marker_file and fabric.global_rank == 0:
        Path(spec.marker_file).write_text(str(os.getpid()))
    shape = model.shape  # make_prompt reads its vocab_size
    prompt = make_prompt(shape, workload.batch_size, workload.prompt_length, workload.seed, device)
    # The bare model (no wrapper, no collectives) runs one generation beside every timed one:
    # on a 2 x H200 VM the host's own speed switched between two levels ~1.8x apart within
    # seconds (docs/benchmarks/h200-2026-11-30.md), which moves the wrapped and the bare run
    # alike, so their ratio stays put where tokens/sec does not. A replicated model is the same
    # object after wrapping; a sharded one is rebuilt whole from the seed after wrapping (see
    # _whole_copy for what that does to the reported peak memory).
    # The threshold's reference: for replicated strategies the median of the bare runs beside
    # the samples; a sharded model (and a generation too short to time a reference beside it,
    # a step or two of a tiny model being all noise) is timed until steady before wrapping.
    paired = not record.sharded and workload.max_new_tokens > spec.reference_steps
    reference = reference_prefill = None
    if spec.reference_steps and not paired:
        # The run's cache length at least: attention reads the whole static cache every step.
        model.setup_caches(
            workload.batch_size,
            workload.prompt_length + max(workload.max_new_tokens, spec.reference_steps),
            device=device,
            dtype=dtype,
        )
        reference, reference_prefill = reference_token_time(
            model.module, prompt, spec.reference_steps, device_sync(device), generate
        )
        model.clear_caches()  # before wrapping: DDP would broadcast these buffers every forward
    else:
        model.clear_caches()  # a builder's model may come with caches or rope buffers made
    # A record with its own `wrap` (pipeline) sets the module up; Fabric only launched.
    module = model.module
    wrapped = record.wrap(module, context) if record.wrap else fabric.setup_module(module)
    # Caches are made after wrapping: DDP snapshots buffers when it wraps and would otherwise
    # broadcast them on every forward; each rank's KV cache is its own.
    model.setup_caches(
        max_batch_size=workload.batch_size,
        max_seq_length=workload.prompt_length + workload.max_new_tokens,
        device=device,
        dtype=dtype,
        module=wrapped.module,
    )
    bare: torch.nn.Module | None = None
    bare_bytes, rss_before_copy = 0, None
    if spec.reference_steps and not record.sharded:
        bare = model.module
    elif spec.reference_steps:
        if device.type == "cpu":  # RSS cannot be taken apart: keep what it was without the copy
            rss_before_copy = memory.peak(device)[0]
        bare, bare_bytes = _whole_copy(workload, device, dtype)
    fences = Fences(sync=device_sync(device), barrier=fabric.barrier)
    unwrapped = Fences(sync=device_sync(device), barrier=lambda: None)
    wrapped_peaks: list[int] = []

    def beside() -> tuple[Sample | None, float]:
        # Runs right after each wrapped generation: the bare model's generation, then the host's
        # own speed (hostspeed.py).
        return bare_generation(), interpreter_loop_seconds()

    def bare_generation() -> Sample | None:
        # With a copy on CUDA, the allocator peak is read before and reset after the bare run:
        # the peak reported is the wrapped run's own.
        nonlocal bare, bare_bytes
        if bare is None:
            return None
        if bare_bytes:
            wrapped_peaks.append(torch.cuda.max_memory_allocated(device) - bare_bytes)
        try:
            sample: Sample | None = timed_generation(
                bare,
                prompt,
                workload.max_new_tokens,
                unwrapped,
                generate=generate,
                steps=bare_steps.override() if bare_steps else None,
            )[0]
        except torch.cuda.OutOfMemoryError:
            sample = None
        if sample is None:  # out of memory: drop the copy, the run goes on without it
            bare, bare_bytes = None, 0
            torch.cuda.empty_cache()
        elif bare_bytes:
            torch.cuda.reset_peak_memory_stats(device)
        return sample

    wrapped_steps, bare_steps, compile_s = _compiled_steps(
        spec, record, wrapped, model.module, bare, prompt, device, generate is not None
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    samples, tokens, timed_from, besides = run_workload(
        wrapped,
        prompt,
        workload.max_new_tokens,
        spec.warmup,
        spec.repeats,
        fences,
        workload.slowdown,
        paired=beside,
        generate=generate,
        progress=progress,
        next_token=record.next_token,
        steps=wrapped_steps.override() if wrapped_steps else None,
    )
    bare_samples = [s for s, _ in besides if s is not None]
    host_loop_s = tuple(seconds for _, seconds in besides)
    if len(bare_samples) < len(samples):
        bare_samples = []  # the copy was dropped during the run: no pairs to speak of
    # Compiled, the reference is the compiled bare model beside the samples, never the eager
    # one timed before wrapping.
    compiled_loop = wrapped_steps is not None and wrapped_steps.override() is not None
    if (paired or compiled_loop) and bare_samples:
        steps = workload.max_new_tokens
        reference = statistics.median(step_seconds(s, steps) for s in bare_samples)
    # No whole copy beside a compiled run (it did not fit): the threshold says its reference
    # was the eager model's, slower than a compiled one.
    eager_reference = compiled_loop and reference is not None and not bare_samples
    fabric_strategy, sharding, wrapper = record.describe_implementation(fabric, wrapped)
    backend = ""
    if torch.distributed.is_initialized():
        backend = str(torch.distributed.get_backend())
    peak, memory_kind = memory.peak(device)
    if wrapped_peaks:
        # With the copy dropped mid-run, the plain peak since then may still hold part of the
        # bare run that failed: a slight overestimate in a rare case.
        peak = max(wrapped_peaks) if bare is not None else max(peak, *wrapped_peaks)
    if rss_before_copy is not None:
        peak, memory_kind = rss_before_copy, f"{memory_kind} (before the bare copy was built)"
    return RankResult(
        rank=fabric.global_rank,
        samples=tuple(samples),
        peak_memory_bytes=peak,
        memory_kind=memory_kind,
        implementation=Implementation(fabric_strategy, sharding, backend, wrapper),
        versions=software_versions(),
        device_name=_device_name(device),
        tokens=tuple(tuple(int(t) for t in row) for row in tokens.tolist()),
        replicas=record.replicas(fabric.world_size),
        timed_from=timed_from,
        reference_token_s=reference,
        bare_samples=tuple(bare_samples),
        host_loop_s=host_loop_s,
        calibration=calibration,
        model_shape=shape,
        compile_s=compile_s,
        compiled=wrapped_steps.how if wrapped_steps else "",
        cuda_graphs=bool(wrapped_steps and wrapped_steps.cuda_graphs),
        graph_breaks=bool(wrapped_steps and wrapped_steps.graph_breaks),
        # the bare runs' prefill; with no copy beside the run, the one timed before wrapping
        reference_prefill_s=_median_prefill(bare_samples) if bare_samples else reference_prefill,
        eager_reference=eager_reference,
    )


def _median_prefill(samples: list[Sample]) -> float | None:
    prefills = [s.ttft_s for s in samples if s.ttft_s is not None]
    return statistics.median(prefills) if prefills else None


def _compiled_steps(
    spec: RunSpec,
    record: Any,
    wrapped: Any,
    inner: torch.nn.Module,
    bare: torch.nn.Module | None,
    prompt: torch.Tensor,
    device: torch.device,
    own_loop: bool,
) -> tuple[Any, Any, float | None]:
    """(wrapped steps, bare steps, compile seconds) for --distperf-compile, each a
    compiled.CompiledStep; (None, None, None) for an eager run."""
    if not spec.compile:
        return None, None, None
    from pytest_distperf.ranks.compiled import (
        CompiledStep,
        compile_bare_step,
        compile_decode_step,
        settle,
    )

    if own_loop:
        return (
            CompiledStep(None, "eager: the test's own generate= loop is timed as it is"),
            None,
            None,
        )
    sync = device_sync(device)
    replicated = not record.sharded and record.next_token is None
    compiled = compile_decode_step(
        wrapped, inner, device, replicated=replicated, own_step=record.next_token is not None
    )
    seconds = settle(compiled, wrapped, prompt, sync)
    bare_steps = compiled if replicated and bare is inner else None
    if bare is not None and bare_steps is None:
        bare_steps = compile_bare_step(bare, device, with_prefill=compiled.prefill is not None)
        seconds += settle(bare_steps, bare, prompt, sync)
    return compiled, bare_steps, seconds


def _forget_compiled_code() -> None:
    """A pooled rank compiles the same step functions for test after test: drop the earlier
    tests' code and CUDA graphs, whose guards would pile up to dynamo's recompile limit and whose
    graph pools would hold memory (inductor's on-disk cache still serves a repeated test)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is not None and torch.cuda.is_available():
        trees.reset_cudagraph_trees()  # not all torch versions' dynamo.reset() does this


def _rank_device(accelerator: str) -> torch.device:
    """The device Fabric gives this rank (its local rank's GPU), known before Fabric exists."""
    if accelerator == "cuda":
        local = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
        return torch.device("cuda", int(local))
    return torch.device("cpu")


def _join_group(device: torch.device) -> None:
    """Join the run's process group as Fabric would, unless the launcher already has (the rank
    pool does): calibration comes before the model, and the strategy is built for the model."""
    from torch.distributed.constants import default_pg_timeout

    dist = torch.distributed
    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=default_pg_timeout)
    if backend == "nccl":  # torch warns at exit about a process group never destroyed
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


def _calibrate(
    spec: RunSpec, shape: ModelShape | None, device: torch.device, dtype: torch.dtype
) -> Any:
    """Collectives at the session's sizes and, given the built model's shape, at every size
    any strategy would use for it."""
    from pytest_distperf.ranks.calibrate import calibrate

    sizes = spec.calibration_sizes or MessageSizes((), ())
    if shape is not None:
        workload = spec.workload
        own = message_sizes(
            shape,
            strategy_names(),
            spec.devices,
            PRECISION_BYTES[workload.precision],
            workload.batch_size,
        )
        sizes = MessageSizes(
            tuple(sorted({*sizes.all_gather, *own.all_gather})),
            tuple(sorted({*sizes.all_reduce, *own.all_reduce})),
            tuple(sorted({*sizes.p2p, *own.p2p})),
        )
    return calibrate(sizes.all_gather, sizes.all_reduce, device, dtype, sizes_p2p=sizes.p2p)


def _whole_copy(workload: Workload, device: torch.device, dtype: torch.dtype) -> tuple[Any, int]:
    """A sharded rank's whole, unwrapped model with its own KV cache, built from the seed once
    wrapping has freed the unsharded weights; (None, 0) when it does not fit.

    On CUDA, its bytes are returned so that they can be taken out of the allocator peak, and
    it is kept only if as much memory again stays free (room for what the wrapped run gathers,
    which for fsdp-noreshard is the whole model). On CPU ranks its bytes cannot be taken out of
    the process RSS peak, which is read before it is built instead (the whole-model build before
    wrapping already set that peak).
    """
    cuda = device.type == "cuda"
    allocated = torch.cuda.memory_allocated(device) if cuda else 0
    try:
        built = build(workload, device, dtype)
        built.setup_caches(
            workload.batch_size,
            workload.prompt_length + workload.max_new_tokens,
            device=device,
            dtype=dtype,
        )
        copy = built.module
    except torch.cuda.OutOfMemoryError:
        copy = None
    if not cuda:
        return copy, 0
    copy_bytes = torch.cuda.memory_allocated(device) - allocated
    if copy is not None and torch.cuda.mem_get_info(device)[0] < copy_bytes:
        copy = None
    if copy is None:
        torch.cuda.empty_cache()
        return None, 0
    return copy, copy_bytes


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def software_versions() -> dict[str, str]:
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": fabric_version(),
    }
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
        nccl = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return versions
