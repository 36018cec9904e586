"""Runs inside one rank: Fabric strategy -> model -> timed generations -> RankResult.

The launcher starts this in fresh processes with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT already set, so Fabric sees an externally launched job and never re-runs pytest.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import platform
import resource
import signal
import statistics
import sys
from pathlib import Path

import torch
from distperf_model.config import Config
from distperf_model.generate import make_prompt
from distperf_model.model import build_model

from .results import Implementation, RankResult, RunSpec
from .strategies import describe_implementation, get_strategy, set_wrap_unit
from .workload import (
    Fences,
    device_sync,
    reference_token_time,
    run_workload,
    timed_generation,
)

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
    fabric = Fabric(
        accelerator=spec.accelerator,
        devices=spec.devices // spec.nodes,
        num_nodes=spec.nodes,
        strategy=get_strategy(spec.strategy).build(spec.accelerator, spec.devices),
        precision=FABRIC_PRECISION[workload.precision],
    )
    fabric.launch()
    if spec.marker_file and fabric.global_rank == 0:
        Path(spec.marker_file).write_text(str(os.getpid()))
    device, dtype = fabric.device, DTYPES[workload.precision]
    calibration = None
    if spec.calibration_sizes is not None:
        from .calibrate import calibrate

        sizes = spec.calibration_sizes
        calibration = calibrate(sizes.all_gather, sizes.all_reduce, device, dtype)
    # Every rank builds the same weights from the seed; sharded strategies then keep their shard.
    model = _build(workload.model, workload.seed, device, dtype)
    config = model.config
    prompt = make_prompt(config, workload.batch_size, workload.prompt_length, workload.seed, device)
    # A replicated model stays whole after wrapping, so its reference (the same model unwrapped,
    # no collectives) is timed beside every sample of the run: on a 2 x H200 VM eager decode
    # switched between two speeds ~1.5x apart within seconds, and a reference timed before the
    # run was more than 25% off it in 9 of 18 runs. A sharded model can only be timed
    # whole before it is wrapped; so can a generation too short to time a reference beside it
    # (a step or two of a tiny model is all noise), which is timed until steady instead.
    paired = (
        not get_strategy(spec.strategy).sharded and workload.max_new_tokens > spec.reference_steps
    )
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
    set_wrap_unit(model.block_class)
    wrapped = fabric.setup_module(model)
    # Caches are made after wrapping: DDP snapshots buffers when it wraps and would otherwise
    # broadcast them on every forward; each rank's KV cache is its own.
    wrapped.module.setup_caches(
        max_batch_size=workload.batch_size,
        max_seq_length=workload.prompt_length + workload.max_new_tokens,
        device=device,
        dtype=dtype,
    )
    fences = Fences(sync=device_sync(device), barrier=fabric.barrier)
    unwrapped = Fences(sync=device_sync(device), barrier=lambda: None)

    def reference_beside() -> float:
        # The same generation through the bare model (same object, same caches): no wrapper.
        sample, _ = timed_generation(model, prompt, workload.max_new_tokens, unwrapped)
        return sample.decode_s / (workload.max_new_tokens - 1)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    samples, tokens, timed_from, beside = run_workload(
        wrapped,
        prompt,
        workload.max_new_tokens,
        spec.warmup,
        spec.repeats,
        fences,
        workload.slowdown,
        paired=reference_beside if paired and spec.reference_steps else None,
    )
    if beside:
        reference = statistics.median(beside)
    fabric_strategy, sharding, wrapper = describe_implementation(fabric, wrapped)
    backend = ""
    if torch.distributed.is_initialized():
        backend = str(torch.distributed.get_backend())
    peak, memory_kind = _peak_memory(device)
    return RankResult(
        rank=fabric.global_rank,
        samples=tuple(samples),
        peak_memory_bytes=peak,
        memory_kind=memory_kind,
        implementation=Implementation(fabric_strategy, sharding, backend, wrapper),
        versions=software_versions(),
        device_name=_device_name(device),
        tokens=tuple(tuple(int(t) for t in row) for row in tokens.tolist()),
        replicas=fabric.world_size,  # every strategy here is data-parallel (results.py)
        timed_from=timed_from,
        reference_token_s=reference,
        calibration=calibration,
    )


def _build(name: str, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    if ":" not in name:
        return build_model(Config.from_name(name), seed=seed, device=device, dtype=dtype)
    module_name, _, function = name.partition(":")
    builder = getattr(importlib.import_module(module_name), function)
    return builder(seed=seed, device=device, dtype=dtype)


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
