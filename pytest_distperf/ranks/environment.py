"""What a rank process is, apart from any one test: its device, its process group, the compiled
code a pooled rank keeps between tests, and the versions it reports."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from platform import machine, processor, python_version

import torch
from torch.distributed import Store

from pytest_distperf.platform import Platform, platform_of
from pytest_distperf.ranks import allocator
from pytest_distperf.ranks.fabric import fabric_version


def rank_device(platform: Platform) -> torch.device:
    """The device Fabric gives this rank (its local rank's GPU), known before Fabric exists."""
    if not platform.gpus:
        return torch.device(platform.name)
    local = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0"))
    return torch.device(platform.name, int(local))


def join_group(
    device: torch.device, store: Store | None = None, rank: int = 0, world: int = 1
) -> None:
    """Join the run's process group as Fabric would, unless joined; through env://, or `store`
    as `rank` of `world` (a launched job's group)."""
    from torch.distributed.constants import default_pg_timeout

    dist = torch.distributed
    if dist.is_initialized():
        return
    platform = platform_of(device.type)
    if platform.gpus:
        torch.cuda.set_device(device)
    joined = {} if store is None else {"store": store, "rank": rank, "world_size": world}
    dist.init_process_group(platform.backend, timeout=default_pg_timeout, **joined)
    if platform.backend == "nccl":  # torch warns at exit about a process group never destroyed
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


def all_ranks_done(device: torch.device) -> Callable[[bool], bool]:
    """`done -> whether every rank is done`, for loops whose length each rank decides."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return bool

    def all_done(done: bool) -> bool:
        flag = torch.tensor([int(done)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    return all_done


def global_rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_initialized() else 0


def forget_compiled_code() -> None:
    """Drop earlier tests' compiled code and CUDA graphs: their guards would pile up to dynamo's
    recompile limit, their pools hold memory."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is not None and torch.cuda.is_available():
        trees.reset_cudagraph_trees()  # not all torch versions' dynamo.reset() does this


def device_name(device: torch.device) -> str:
    if platform_of(device.type).gpus:
        return torch.cuda.get_device_name(device)
    return processor() or machine()


def software_versions() -> dict[str, str]:
    versions = {
        "python": python_version(),
        "torch": torch.__version__,
        "lightning": fabric_version(),
    }
    if allocator.settings():  # what a CPU rank's allocator ran with (ranks/allocator.py)
        versions["malloc"] = allocator.settings()
    if torch.cuda.is_available():
        versions["cuda"] = str(torch.version.cuda)
        nccl = torch.cuda.nccl.version()
        versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    return versions
