"""What differs between the device kinds ranks run on: one record per kind, looked up once by
the accelerator's name (`platform_of`) rather than branched on where used. Pure: no torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Platform:
    name: str  # the accelerator: the option's value and torch's device type
    label: str  # a device's name in a topology's matrix: GPU0, CPU0
    backend: str  # the ranks' process group
    fsdp: str  # what `fsdp` runs: FSDP1 (Fabric's FSDPStrategy refuses CPU ranks) or FSDP2
    # Each rank needs a device of its own: a run asks for at most as many as are visible.
    gpus: bool
    # Kernels queue behind the host: a clock stops after a device synchronize, the counted
    # generation's kernels are profiled, and a compiled step can replay as a CUDA graph.
    queues_kernels: bool
    # Memory is the device allocator's (an exact peak, reset per test); else the process's RSS,
    # whose heap a rank keeps, settles and pads (ranks/allocator.py).
    allocator_memory: bool
    # Ranks share the host's cores: each gets its share of threads.
    shares_cores: bool
    # Calibration's timed copy: it must last far longer than a launch and a sync, whose time a
    # small copy's is mostly (docs/benchmarks/h200-2026-12-01-compiled.md).
    copy_probe_bytes: int
    matmul_size: int  # the training calibration's square matmul
    matmul_repeats: int
    # The largest message calibrated (None: every size used): over loopback a model's largest
    # gathers take seconds each; beyond it a collective is priced at the best bus bandwidth
    # measured (Calibration.time_at).
    calibration_max_bytes: int | None


CPU = Platform(
    name="cpu", label="CPU", backend="gloo", fsdp="FSDP2", gpus=False, queues_kernels=False,
    allocator_memory=False, shares_cores=True, copy_probe_bytes=64 << 20,
    matmul_size=1024, matmul_repeats=5, calibration_max_bytes=32 << 20,
)  # fmt: skip
CUDA = Platform(
    name="cuda", label="GPU", backend="nccl", fsdp="FSDP1", gpus=True, queues_kernels=True,
    allocator_memory=True, shares_cores=False, copy_probe_bytes=1 << 30,
    matmul_size=8192, matmul_repeats=20, calibration_max_bytes=None,
)  # fmt: skip
PLATFORMS = {p.name: p for p in (CPU, CUDA)}


def fsdp_runs(accelerator: str) -> str:
    """What `fsdp` runs on `accelerator`; FSDP2 where none is known (`distperf predict`)."""
    known = PLATFORMS.get(accelerator)
    return known.fsdp if known else "FSDP2"


def platform_of(accelerator: str) -> Platform:
    """The record of a resolved accelerator ("cpu" or "cuda")."""
    try:
        return PLATFORMS[accelerator]
    except KeyError:
        raise ValueError(f"no platform {accelerator!r}; known: {', '.join(PLATFORMS)}") from None
