"""In-rank timings the calibration is made of (ranks/calibrate.py): collectives, a device copy,
the transfer/host overlap; each call fenced, the slowest rank's median agreed."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import torch
import torch.distributed as dist


class Group(NamedTuple):
    """The ranks one collective runs over: a process group and this rank's place in it."""

    handle: Any  # a ProcessGroup; None: the default group
    rank: int  # this rank's index in the group
    peers: tuple[int, ...]  # the group's global ranks, in group order

    @property
    def size(self) -> int:
        return len(self.peers)


def world_group() -> Group:
    return Group(None, dist.get_rank(), tuple(range(dist.get_world_size())))


@contextmanager
def node_group(per_node: int) -> Iterator[Group]:
    """This rank's node: its `per_node` consecutive ranks, as torchrun and srun place them.
    Every rank makes every node's group (torch's rule for new_group), then destroys them."""
    mine, groups = dist.new_subgroups(group_size=per_node)
    rank = dist.get_rank()
    first = rank - rank % per_node
    try:
        yield Group(mine, rank % per_node, tuple(range(first, first + per_node)))
    finally:
        for group in groups:
            dist.destroy_process_group(group)


class Timer(NamedTuple):
    """How every timed call is fenced, and how the ranks agree on a figure."""

    sync: Callable[[], None]
    barrier: Callable[[], None]
    agree: Callable[[float], float]


def barrier_after_sync(device: torch.device, sync: Callable[[], None]) -> None:
    # A tiny all-reduce rather than dist.barrier(): it works the same on gloo and NCCL and needs
    # no device_ids for NCCL.
    token = torch.zeros(1, device=device)
    dist.all_reduce(token)
    sync()


@dataclass(frozen=True)
class _Collective:
    """One kind of collective: the bytes it moves for the tensor each rank holds, and its call."""

    gathers: bool  # an all-gather: its bytes are the gathered output's, every rank's share
    call: Callable[[torch.Tensor, Group], Callable[[], object]]  # (tensor, group) -> op


_COLLECTIVES = {
    "all_gather": _Collective(True, lambda shard, g: partial(_fresh_all_gather, shard, g)),
    "all_reduce": _Collective(False, lambda tensor, g: partial(_all_reduce, tensor, g)),
    "p2p": _Collective(False, lambda message, g: partial(_ring_hop, message, g)),
}


def time_collective(
    kind: str,
    sizes: Sequence[int],
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
    warmup: int,
    iters: int,
    group: Group,
) -> tuple[list[int], list[float]]:
    """(bytes moved, median seconds this rank) of `kind` in `group` at each size, ascending."""
    collective = _COLLECTIVES[kind]
    n = group.size
    element = torch.tensor([], dtype=dtype).element_size()
    share = n if collective.gathers else 1
    moved, times = [], []
    for size in sorted(set(sizes)):
        elements = max(1, -(-size // (element * share)))  # ceil: at least the asked-for bytes
        tensor = torch.ones(elements, dtype=dtype, device=device)
        moved.append(elements * share * element)
        times.append(
            median_time(
                collective.call(tensor, group),
                timer.sync,
                timer.barrier,
                *_repeats(moved[-1], warmup, iters),
                timer.agree,
            )
        )
        del tensor
    return moved, times


def slowest_of_all(device: torch.device, groups: Sequence[Sequence[float]]) -> list[list[float]]:
    """Every rank's largest of each figure, in one all-reduce, grouped as given."""
    flat = [seconds for group in groups for seconds in group]
    local = torch.tensor(flat, dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    values = iter(local.tolist())
    return [[next(values) for _ in group] for group in groups]


# torch 2.13 deprecates all_gather_into_tensor for all_gather_single (same arguments); older
# releases only have the former.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


SMALL_MESSAGE_BYTES = 1 << 20
SMALL_MESSAGE_WARMUP = 5
SMALL_MESSAGE_ITERS = 20


def _repeats(nbytes: int, warmup: int, iters: int) -> tuple[int, int]:
    # Small messages cost microseconds to a millisecond, and their first calls pay for
    # connection set-up (gloo: several ms): more repeats cost nothing and steady the median.
    if nbytes <= SMALL_MESSAGE_BYTES:
        return max(warmup, SMALL_MESSAGE_WARMUP), max(iters, SMALL_MESSAGE_ITERS)
    return warmup, iters


# A call this long is a steady measurement by itself (the host's jitter is a small share of it);
# more repeats would only add seconds each, as huge all-gathers do over loopback on CPU ranks.
SLOW_CALL_S = 0.5


def slowest_rank_seconds(device: torch.device, seconds: float) -> float:
    """The largest of every rank's `seconds`: ranks must agree on how often they call."""
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def median_time(
    op: Callable[[], object],
    sync: Callable[[], None],
    barrier: Callable[[], None],
    warmup: int,
    iters: int,
    agree: Callable[[float], float],
    slow_call_s: float = SLOW_CALL_S,
) -> float:
    """Median seconds of `iters` fenced calls of `op` after `warmup` untimed ones; a single
    timed call when the last warm-up call took `slow_call_s` or more on any rank (`agree`)."""
    warm_s = 0.0
    for _ in range(warmup):
        start = time.perf_counter()
        op()
        sync()
        warm_s = time.perf_counter() - start
    if warmup and agree(warm_s) >= slow_call_s:
        iters = 1
    samples = []
    for _ in range(iters):
        sync()
        barrier()
        start = time.perf_counter()
        op()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _fresh_all_gather(shard: torch.Tensor, group: Group) -> torch.Tensor:
    # A new output every call, as FSDP allocates one: free through CUDA's caching allocator, on
    # CPU fresh pages faulted in, as costly as the transfer itself over loopback.
    out = torch.empty(shard.numel() * group.size, dtype=shard.dtype, device=shard.device)
    _all_gather(out, shard, group=group.handle)
    return out


def _all_reduce(tensor: torch.Tensor, group: Group) -> None:
    dist.all_reduce(tensor, group=group.handle)


def _ring_hop(message: torch.Tensor, group: Group) -> None:
    # Send to the next rank while receiving from the one before, as one batch: every link
    # carries one hop, and no rank's send waits for a receive queued behind it (NCCL).
    rank, n, peers = group.rank, group.size, group.peers
    arrived = torch.empty_like(message)
    ops = [
        dist.P2POp(dist.isend, message, peers[(rank + 1) % n], group.handle),
        dist.P2POp(dist.irecv, arrived, peers[(rank - 1) % n], group.handle),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def _fresh_copy(src: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(src).copy_(src)


def copy_bandwidth(nbytes: int, seconds: float) -> float:
    return 2 * nbytes / seconds if seconds > 0 else 0.0  # read + write, as the copy moves both


def copy_times(
    copy_bytes: int, device: torch.device, timer: Timer, warmup: int, iters: int
) -> tuple[float, float]:
    """Median seconds of `copy_bytes` (uint8: any size) copied into an existing tensor (weights'
    streaming) and into a new one (FSDP2's copy-out; CPU: several times slower, page faults)."""
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    sync, barrier, agree = timer
    try:
        warm = median_time(partial(dst.copy_, src), sync, barrier, max(warmup, 1), iters, agree)
        fresh = median_time(partial(_fresh_copy, src), sync, barrier, max(warmup, 1), iters, agree)
        return warm, fresh
    finally:
        del src, dst


# Host-issued work for the overlap probe: kernels on a tiny tensor cost their launch, not their
# bytes, which is what eager decode and FSDP's hooks spend a token on.
HOST_WORK_ELEMENTS = 256
HOST_WORK_PROBE_OPS = 200
HOST_WORK_MAX_OPS = 200_000


# The overlap probe's all-gather lasts at most this long where the sizes allow: a longer one
# shows the machine's hidden share no better, and every phase of the probe repeats it.
OVERLAP_PROBE_MAX_S = 0.25


def probe_index(times: Sequence[float]) -> int:
    """Index of the overlap probe's all-gather among sizes in ascending order: the largest whose
    call took at most OVERLAP_PROBE_MAX_S, else the fastest."""
    fitting = [i for i, seconds in enumerate(times) if seconds <= OVERLAP_PROBE_MAX_S]
    return fitting[-1] if fitting else min(range(len(times)), key=times.__getitem__)


def overlap_probe(
    gathers: tuple[list[int], list[float]],
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
    warmup: int,
    iters: int,
) -> tuple[float, float, float]:
    """`_overlap_times` at the all-gather size `probe_index` picks of the (bytes, seconds)
    measured; zeros where nothing was gathered or one rank has no peer."""
    gathered_bytes, gather_times = gathers
    if not gathered_bytes or dist.get_world_size() < 2:
        return 0.0, 0.0, 0.0
    probe = probe_index([timer.agree(t) for t in gather_times])  # the same size everywhere
    return _overlap_times(
        gathered_bytes[probe], gather_times[probe], device, dtype, timer, warmup, iters
    )


def overlap_fraction(transfer_s: float, host_s: float, both_s: float) -> float:
    """Share of the shorter of two activities hidden when they run at once, in [0, 1]: 1 when
    together (`both_s`) they take only the longer's time, 0 when their sum or more."""
    shorter = min(transfer_s, host_s)
    if shorter <= 0:
        return 0.0
    hidden = transfer_s + host_s - both_s
    return min(max(hidden / shorter, 0.0), 1.0)


def _host_work(scratch: torch.Tensor, ops: int) -> None:
    for _ in range(ops):
        scratch.add_(1.0)


def _overlap_times(
    gathered_bytes: int,
    gather_s: float,
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
    warmup: int,
    iters: int,
) -> tuple[float, float, float]:
    """(all-gather alone, host work alone, both at once), median seconds, this rank: the
    gather started asynchronously, as FSDP's next unit's, while the host issues about as much
    small-kernel work (equal lengths show the hidden share best)."""
    sync, barrier, agree = timer
    world = world_group()
    n = world.size
    element = torch.tensor([], dtype=dtype).element_size()
    shard = torch.ones(max(1, gathered_bytes // (element * n)), dtype=dtype, device=device)
    scratch = torch.zeros(HOST_WORK_ELEMENTS, dtype=dtype, device=device)
    probe = median_time(
        partial(_host_work, scratch, HOST_WORK_PROBE_OPS),
        sync,
        barrier,
        max(warmup, 1),
        iters,
        agree,
    )
    per_op = probe / HOST_WORK_PROBE_OPS
    # Every rank must issue the same work, or the faster host would wait for the slower.
    ops_local = torch.tensor([gather_s / per_op if per_op > 0 else 0.0], device=device)
    dist.all_reduce(ops_local, op=dist.ReduceOp.MIN)
    ops = int(min(max(ops_local.item(), HOST_WORK_PROBE_OPS), HOST_WORK_MAX_OPS))

    gather = median_time(
        partial(_fresh_all_gather, shard, world), sync, barrier, warmup, iters, agree
    )
    host = median_time(partial(_host_work, scratch, ops), sync, barrier, warmup, iters, agree)
    together = median_time(
        partial(_gather_during_host_work, shard, world, scratch, ops),
        sync,
        barrier,
        warmup,
        iters,
        agree,
    )
    return gather, host, together


def _gather_during_host_work(
    shard: torch.Tensor, world: Group, scratch: torch.Tensor, ops: int
) -> None:
    out = torch.empty(shard.numel() * world.size, dtype=shard.dtype, device=shard.device)
    handle = _all_gather(out, shard, async_op=True)
    _host_work(scratch, ops)
    handle.wait()


# The in-step probe: small all-reduces, each after a burst of host-issued kernels about as long
# as a decode layer's on CPU ranks, with no barrier before it (docs/benchmarks/
# cpu-2026-12-02-allreduce-in-step.md); bursts alone and with a call after each alternate.
IN_STEP_BURST_S = 0.5e-3
IN_STEP_CALLS = 30
IN_STEP_ROUNDS = 3


def all_reduce_between_bursts(
    nbytes: int, device: torch.device, dtype: torch.dtype, timer: Timer
) -> float:
    """Mean seconds one small all-reduce adds to a stretch of host compute when issued between
    bursts of it, as a decode whose layers wait on the ranks' collectives issues it (tp's
    all-reduces): the ranks drift apart between calls, the first to arrive waits and is woken,
    which a call fenced by a barrier does not pay. This rank's; 0 without a peer."""
    world = world_group()
    if world.size < 2:
        return 0.0
    sync, barrier, _ = timer
    element = torch.tensor([], dtype=dtype).element_size()
    message = torch.ones(max(1, nbytes // element), dtype=dtype, device=device)
    scratch = torch.zeros(HOST_WORK_ELEMENTS, dtype=dtype, device=device)
    probe = median_time(
        partial(_host_work, scratch, HOST_WORK_PROBE_OPS), sync, barrier, 1, 3, float
    )
    # Every rank issues the same work, as a tensor-parallel rank its equal share.
    per_op = max(probe / HOST_WORK_PROBE_OPS, 1e-9)
    ops_local = torch.tensor([IN_STEP_BURST_S / per_op], device=device)
    dist.all_reduce(ops_local, op=dist.ReduceOp.MIN)
    ops = int(min(max(ops_local.item(), 1), HOST_WORK_MAX_OPS))
    for _ in range(3):  # the connection and the burst warm
        _host_work(scratch, ops)
        _all_reduce(message, world)
    alone = with_calls = 0.0
    for _ in range(IN_STEP_ROUNDS):
        barrier()
        start = time.perf_counter()
        for _ in range(IN_STEP_CALLS):
            _host_work(scratch, ops)
        alone += time.perf_counter() - start
        barrier()
        start = time.perf_counter()
        for _ in range(IN_STEP_CALLS):
            _host_work(scratch, ops)
            _all_reduce(message, world)
        sync()
        with_calls += time.perf_counter() - start
    return max(with_calls - alone, 0.0) / (IN_STEP_ROUNDS * IN_STEP_CALLS)
