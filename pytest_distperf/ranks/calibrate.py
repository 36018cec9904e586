"""In-rank micro-benchmarks at the model's own message sizes: all-gather, all-reduce,
point-to-point hops and memory bandwidth, in nccl-tests' terms; each figure the slowest rank's
median, timed on the host between fences as eager code pays it (launch cost included)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from functools import partial

import torch
import torch.distributed as dist

from pytest_distperf.perfmodel.calibration import LATENCY_PROBE_BYTES, Calibration, CollectiveFigure
from pytest_distperf.platform import platform_of
from pytest_distperf.ranks.probes import (
    Group,
    Timer,
    all_reduce_between_bursts,
    barrier_after_sync,
    copy_bandwidth,
    copy_times,
    node_group,
    overlap_fraction,
    overlap_probe,
    slowest_of_all,
    slowest_rank_seconds,
    time_collective,
    world_group,
)
from pytest_distperf.ranks.timing import device_sync


def calibrate(
    sizes_all_gather: Sequence[int],
    sizes_all_reduce: Sequence[int],
    device: torch.device | str,
    dtype: torch.dtype,
    warmup: int = 1,
    iters: int = 3,
    copy_bytes: int | None = None,
    sizes_p2p: Sequence[int] = (),
    nodes: int | None = None,
) -> Calibration:
    """Collectives and memory bandwidth, called by every rank with the same arguments (the
    collectives pair up by call order). Sizes are rounded to whole elements per rank; the
    figures carry the bytes that moved. `nodes` (None: from LOCAL_WORLD_SIZE) the ranks span."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("calibrate() needs an initialised torch.distributed process group")
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    device = torch.device(device)
    n = dist.get_world_size()
    nodes = job_nodes(n) if nodes is None else nodes
    if nodes < 1 or n % nodes:
        raise ValueError(f"{n} ranks cannot be placed evenly on {nodes} node(s)")
    sync = device_sync(device)
    timer = Timer(
        sync, partial(barrier_after_sync, device, sync), partial(slowest_rank_seconds, device)
    )
    asked = {"all_gather": sizes_all_gather, "all_reduce": sizes_all_reduce}
    asked["p2p"] = sizes_p2p if n > 1 else ()  # no peer to send to

    def measure(group: Group) -> dict[str, tuple[list[int], list[float]]]:
        return {
            k: time_collective(k, s, device, dtype, timer, warmup, iters, group)
            for k, s in asked.items()
        }

    measured = measure(world_group())
    within: dict[str, tuple[list[int], list[float]]] = {}
    if nodes > 1 and n // nodes > 1:
        with node_group(n // nodes) as node:
            within = measure(node)
    platform = platform_of(device.type)
    copy_bytes = max(1, int(platform.copy_probe_bytes if copy_bytes is None else copy_bytes))
    copies = copy_times(copy_bytes, device, timer, warmup, iters)
    overlap_times = overlap_probe(measured["all_gather"], device, dtype, timer, warmup, iters)
    # Where the host runs the compute, a collective between its layers also pays the ranks'
    # drift (probes.all_reduce_between_bursts); where kernels queue, their stream hides it.
    small = min(sizes_all_reduce, default=LATENCY_PROBE_BYTES)
    queued = platform.queues_kernels
    in_step = 0.0 if queued else all_reduce_between_bursts(small, device, dtype, timer)
    # One MAX all-reduce for all figures: every rank then holds the slowest rank's numbers.
    times = [t for _, t in (*measured.values(), *within.values())]
    *collective_times, (copy_time, fresh_copy_time), overlap, (in_step,) = slowest_of_all(
        device, [*times, copies, overlap_times, (in_step,)]
    )
    base = Calibration(
        world_size=n,
        backend=str(dist.get_backend()),
        device_type=device.type,
        all_gather=(),
        all_reduce=(),
        memory_bandwidth=copy_bandwidth(copy_bytes, copy_time),
        latency_s=0.0,
        fresh_copy_bandwidth=copy_bandwidth(copy_bytes, fresh_copy_time),
        overlap=overlap_fraction(*overlap),
        in_step_latency_s=in_step,
    )
    whole = _with_figures(base, measured, collective_times[: len(measured)])
    inner = dataclasses.replace(base, world_size=n // nodes)
    inner = _with_figures(inner, within, collective_times[len(measured) :]) if within else None
    return dataclasses.replace(whole, nodes=nodes, within_node=inner)


def job_nodes(world_size: int, environ: Mapping[str, str] = os.environ) -> int:
    """The nodes a job's ranks span, as torchrun's LOCAL_WORLD_SIZE says (srun's jobs are given
    it too: launch/job.py); 1 where it is unset or does not divide the world evenly."""
    try:
        local = int(environ.get("LOCAL_WORLD_SIZE", world_size))
    except ValueError:
        return 1
    return world_size // local if 0 < local <= world_size and world_size % local == 0 else 1


def _with_figures(
    base: Calibration,
    measured: Mapping[str, tuple[list[int], list[float]]],
    times: Sequence[Sequence[float]],
) -> Calibration:
    """`base` with the collectives of `measured` at the (slowest rank's) `times`, in its order."""
    n = base.world_size
    figures: dict[str, tuple[CollectiveFigure, ...]] = {}
    for (kind, (moved, _)), seconds in zip(measured.items(), times, strict=True):
        pairs = zip(moved, seconds, strict=True)
        figures[kind] = tuple(CollectiveFigure.from_time(kind, b, t, n) for b, t in pairs)
    latency = min((f.time_s for f in figures["all_gather"]), default=0.0)
    return dataclasses.replace(base, **figures, latency_s=latency)
