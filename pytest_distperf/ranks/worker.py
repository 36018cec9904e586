"""Runs inside one rank: model -> Fabric strategy -> timed generations -> RankResult.

The launcher starts this in fresh processes with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT already set, so Fabric sees an externally launched job and never re-runs pytest.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib
import os
import platform
import resource
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from distperf_model.config import Config
from distperf_model.generate import make_prompt
from distperf_model.model import build_model

from pytest_distperf.ranks.hostspeed import interpreter_loop_seconds
from pytest_distperf.ranks.timing import (
    Fences,
    device_sync,
    reference_token_time,
    run_workload,
    timed_generation,
)
from pytest_distperf.spec import Implementation, RankResult, RunSpec, Sample, Workload
from pytest_distperf.strategies import BuildContext, get_strategy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FABRIC_PRECISION = {"fp32": "32-true", "bf16": "bf16-true", "fp16": "16-true"}


def run_rank(spec: RunSpec) -> RankResult:
    """Entry point of every rank (must stay a module-level function: it is pickled)."""
    # A hung collective never returns to Python, so the watchdog lives in faulthandler's C
    # thread: at the deadline it writes every thread's stack to stderr and exits the rank.
    faulthandler.dump_traceback_later(spec.timeout, exit=True, file=sys.stderr)
    # When another rank fails or times out, the launcher stops this one with SIGTERM: leave its
    # stack behind too, so a hang shows where every rank was.
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    try:
        return _run(spec)
    finally:
        faulthandler.cancel_dump_traceback_later()
        faulthandler.unregister(signal.SIGTERM)


def _run(spec: RunSpec) -> RankResult:
    from lightning.fabric import Fabric

    if spec.accelerator == "cpu":
        torch.set_num_threads(spec.threads_per_rank)
    workload = spec.workload
    record = get_strategy(spec.strategy)
    reason = record.unsupported(spec.accelerator, spec.devices)
    if reason:
        raise ValueError(reason)
    device, dtype = _rank_device(spec.accelerator), DTYPES[workload.precision]
    if spec.devices > 1:
        _join_group(device)
    calibration = None
    if spec.calibration_sizes is not None:
        from pytest_distperf.ranks.calibrate import calibrate

        sizes = spec.calibration_sizes
        calibration = calibrate(sizes.all_gather, sizes.all_reduce, device, dtype)
    # Every rank builds the same weights from the seed; sharded strategies then keep their shard.
    model = _build(workload.model, workload.seed, device, dtype)
    # The strategy is built for this model: FSDP1 wraps its block class as one unit.
    context = BuildContext(spec.accelerator, spec.devices, wrap_units=(model.block_class,))
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
    config = model.config
    prompt = make_prompt(config, workload.batch_size, workload.prompt_length, workload.seed, device)
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
    reference = None
    if spec.reference_steps and not paired:
        model.setup_caches(
            workload.batch_size,
            workload.prompt_length + spec.reference_steps,
            device=device,
            dtype=dtype,
        )
        reference = reference_token_time(model, prompt, spec.reference_steps, device_sync(device))
        model.clear_caches()  # before wrapping: DDP would broadcast these buffers every forward
    wrapped = fabric.setup_module(model)
    # Caches are made after wrapping: DDP snapshots buffers when it wraps and would otherwise
    # broadcast them on every forward; each rank's KV cache is its own.
    wrapped.module.setup_caches(
        max_batch_size=workload.batch_size,
        max_seq_length=workload.prompt_length + workload.max_new_tokens,
        device=device,
        dtype=dtype,
    )
    bare: torch.nn.Module | None = None
    bare_bytes, rss_before_copy = 0, None
    if spec.reference_steps and not record.sharded:
        bare = model
    elif spec.reference_steps:
        if device.type == "cpu":  # ru_maxrss cannot be reset: keep what it was without the copy
            rss_before_copy = _peak_memory(device)[0]
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
                bare, prompt, workload.max_new_tokens, unwrapped
            )[0]
        except torch.cuda.OutOfMemoryError:
            sample = None
        if sample is None:  # out of memory: drop the copy, the run goes on without it
            bare, bare_bytes = None, 0
            torch.cuda.empty_cache()
        elif bare_bytes:
            torch.cuda.reset_peak_memory_stats(device)
        return sample

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
    )
    bare_samples = [s for s, _ in besides if s is not None]
    host_loop_s = tuple(seconds for _, seconds in besides)
    if len(bare_samples) < len(samples):
        bare_samples = []  # the copy was dropped during the run: no pairs to speak of
    if paired and bare_samples:
        steps = max(workload.max_new_tokens - 1, 1)
        reference = statistics.median(s.decode_s / steps for s in bare_samples)
    fabric_strategy, sharding, wrapper = record.describe_implementation(fabric, wrapped)
    backend = ""
    if torch.distributed.is_initialized():
        backend = str(torch.distributed.get_backend())
    peak, memory_kind = _peak_memory(device)
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
    )


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


def _build(name: str, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    if ":" not in name:
        return build_model(Config.from_name(name), seed=seed, device=device, dtype=dtype)
    module_name, _, function = name.partition(":")
    builder = getattr(importlib.import_module(module_name), function)
    return builder(seed=seed, device=device, dtype=dtype)


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
        copy = _build(workload.model, workload.seed, device, dtype)
        copy.setup_caches(
            workload.batch_size,
            workload.prompt_length + workload.max_new_tokens,
            device=device,
            dtype=dtype,
        )
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


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda allocator peak"
    # ru_maxrss is in KiB on Linux; it covers the whole process life (there is no reset).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS peak"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def software_versions() -> dict[str, str]:
    import lightning

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
    }
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
        nccl = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return versions
