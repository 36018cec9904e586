"""In-rank timings the calibration is made of (ranks/calibrate.py): collectives, a device copy,
the transfer/host overlap; each call fenced, the slowest rank's median agreed."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

import torch
import torch.distributed as dist

Group = dist.ProcessGroup  # the ranks one collective runs over


def world_group() -> Group:
    return dist.group.WORLD


@contextmanager
def node_group(per_node: int) -> Iterator[Group]:
    """This rank's node: its `per_node` consecutive ranks, as torchrun and srun place them."""
    mine, groups = dist.new_subgroups(group_size=per_node)
    try:
        yield mine
    finally:
        for group in groups:
            dist.destroy_process_group(group)


class Timer(NamedTuple):
    """How every timed call is fenced, and how the ranks agree on a figure."""

    sync: Callable[[], None]
    barrier: Callable[[], None]
    agree: Callable[[float], float]


def barrier_after_sync(device: torch.device, sync: Callable[[], None]) -> None:
    # Not dist.barrier(): a tiny all-reduce works alike on gloo and NCCL, with no device_ids.
    dist.all_reduce(torch.zeros(1, device=device))
    sync()


SMALL_MESSAGE_BYTES = 1 << 20
SMALL_MESSAGE_WARMUP = 5
SMALL_MESSAGE_ITERS = 20


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
    """(bytes moved, median seconds this rank) of `kind` in `group` at each size, ascending; an
    all-gather's bytes are its gathered output's."""
    call = {"all_gather": _fresh_all_gather, "all_reduce": _all_reduce, "p2p": _ring_hop}[kind]
    element = torch.tensor([], dtype=dtype).element_size()
    share = dist.get_world_size(group) if kind == "all_gather" else 1
    moved, times = [], []
    for size in sorted(set(sizes)):
        elements = max(1, -(-size // (element * share)))  # ceil: at least the asked-for bytes
        tensor = torch.ones(elements, dtype=dtype, device=device)
        moved.append(elements * share * element)
        # Small messages cost microseconds to a millisecond, and their first calls pay for
        # connection set-up (gloo: several ms): more repeats cost nothing and steady the median.
        small = moved[-1] <= SMALL_MESSAGE_BYTES
        warm = max(warmup, SMALL_MESSAGE_WARMUP) if small else warmup
        timed = max(iters, SMALL_MESSAGE_ITERS) if small else iters
        times.append(median_time(partial(call, tensor, group), timer, warm, timed))
        del tensor
    return moved, times


def slowest_of_all(device: torch.device, groups: Sequence[Sequence[float]]) -> list[list[float]]:
    """Every rank's largest of each figure, in one all-reduce, grouped as given."""
    flat = [seconds for group in groups for seconds in group]
    local = torch.tensor(flat, dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    values = iter(local.tolist())
    return [[next(values) for _ in group] for group in groups]


def slowest_rank_seconds(device: torch.device, seconds: float) -> float:
    """The largest of every rank's `seconds`: ranks must agree on how often they call."""
    return slowest_of_all(device, [[seconds]])[0][0]


# torch 2.13 deprecates all_gather_into_tensor for all_gather_single (same arguments); older
# releases only have the former.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# A call this long is a steady measurement by itself (the host's jitter is a small share of it);
# more repeats would only add seconds each, as huge all-gathers do over loopback on CPU ranks.
SLOW_S = 0.5


def median_time(
    op: Callable[[], object], timer: Timer, warmup: int, iters: int, slow_call_s: float = SLOW_S
) -> float:
    """Median seconds of `iters` fenced calls of `op` after `warmup` untimed ones (one, where the
    last warm-up call took `slow_call_s` or more on any rank)."""
    warm_s = 0.0
    for _ in range(warmup):
        start = time.perf_counter()
        op()
        timer.sync()
        warm_s = time.perf_counter() - start
    if warmup and timer.agree(warm_s) >= slow_call_s:
        iters = 1
    samples = []
    for _ in range(iters):
        timer.sync()
        timer.barrier()
        start = time.perf_counter()
        op()
        timer.sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _fresh_all_gather(shard: torch.Tensor, group: Group) -> torch.Tensor:
    # A new output every call, as FSDP allocates one: free through CUDA's caching allocator, on
    # CPU fresh pages faulted in, as costly as the transfer itself over loopback.
    size = dist.get_world_size(group)
    out = torch.empty(shard.numel() * size, dtype=shard.dtype, device=shard.device)
    _all_gather(out, shard, group=group)
    return out


def _all_reduce(tensor: torch.Tensor, group: Group) -> None:
    dist.all_reduce(tensor, group=group)


def _ring_hop(message: torch.Tensor, group: Group) -> None:
    # Send to the next rank while receiving from the one before, as one batch: every link
    # carries one hop, and no rank's send waits for a receive queued behind it (NCCL).
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    arrived = torch.empty_like(message)
    ops = [
        dist.P2POp(dist.isend, message, dist.get_global_rank(group, (rank + 1) % n), group),
        dist.P2POp(dist.irecv, arrived, dist.get_global_rank(group, (rank - 1) % n), group),
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
    """Median seconds of `copy_bytes` copied into an existing tensor (weights' streaming) and
    into a new one (FSDP2's copy-out; CPU: slower, page faults)."""
    src = torch.ones(copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    warmup = max(warmup, 1)
    warm = median_time(partial(dst.copy_, src), timer, warmup, iters)
    return warm, median_time(partial(_fresh_copy, src), timer, warmup, iters)


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


def _host_ops(
    scratch: torch.Tensor, seconds: float, timer: Timer, warmup: int, iters: int, least: int
) -> int:
    """Host work ops that take about `seconds`, the fewest any rank asks for (the same on every
    rank: otherwise the faster host would wait for the slower)."""
    work = partial(_host_work, scratch, HOST_WORK_PROBE_OPS)
    per_op = median_time(work, timer, warmup, iters) / HOST_WORK_PROBE_OPS
    ops = torch.tensor([seconds / per_op if per_op > 0 else 0.0], device=scratch.device)
    dist.all_reduce(ops, op=dist.ReduceOp.MIN)
    return int(min(max(ops.item(), least), HOST_WORK_MAX_OPS))


def overlap_probe(
    gathers: tuple[list[int], list[float]],
    device: torch.device,
    dtype: torch.dtype,
    timer: Timer,
    warmup: int,
    iters: int,
) -> tuple[float, float, float]:
    """(all-gather alone, host work alone, both at once), median seconds this rank, at the size
    `probe_index` picks: the gather started asynchronously, as FSDP's next unit's, while the host
    issues as long a stretch of small kernels. Zeros without a gather or a peer."""
    gathered_bytes, gather_times = gathers
    if not gathered_bytes or dist.get_world_size() < 2:
        return 0.0, 0.0, 0.0
    probe = probe_index([timer.agree(t) for t in gather_times])  # the same size everywhere
    world = world_group()
    element = torch.tensor([], dtype=dtype).element_size()
    elements = max(1, gathered_bytes[probe] // (element * dist.get_world_size()))
    shard = torch.ones(elements, dtype=dtype, device=device)
    scratch = torch.zeros(HOST_WORK_ELEMENTS, dtype=dtype, device=device)
    ops = _host_ops(scratch, gather_times[probe], timer, max(warmup, 1), iters, HOST_WORK_PROBE_OPS)

    def together() -> None:
        out = torch.empty(shard.numel() * dist.get_world_size(), dtype=dtype, device=device)
        handle = _all_gather(out, shard, async_op=True)
        _host_work(scratch, ops)
        handle.wait()

    gather = median_time(partial(_fresh_all_gather, shard, world), timer, warmup, iters)
    host = median_time(partial(_host_work, scratch, ops), timer, warmup, iters)
    return gather, host, median_time(together, timer, warmup, iters)


# The in-step probe: small all-reduces, each after a burst of host-issued kernels about as long
# as a decode layer's on CPU ranks, with no barrier before it (docs/benchmarks/
# cpu-2026-12-02-allreduce-in-step.md); bursts alone and with a call after each alternate.
IN_STEP_BURST_S = 0.5e-3
IN_STEP_CALLS = 30
IN_STEP_ROUNDS = 3


def all_reduce_between_bursts(
    nbytes: int, device: torch.device, dtype: torch.dtype, timer: Timer
) -> float:
    """Mean seconds one small all-reduce adds to host compute when issued between bursts of it,
    as tp's decode does: the ranks drift apart, the first to arrive waits and is woken, which a
    call fenced by a barrier does not pay. This rank's; 0 without a peer."""
    world = world_group()
    if dist.get_world_size() < 2:
        return 0.0
    element = torch.tensor([], dtype=dtype).element_size()
    message = torch.ones(max(1, nbytes // element), dtype=dtype, device=device)
    scratch = torch.zeros(HOST_WORK_ELEMENTS, dtype=dtype, device=device)
    ops = _host_ops(scratch, IN_STEP_BURST_S, timer._replace(agree=float), 1, 3, 1)
    for _ in range(3):  # the connection and the burst warm
        _host_work(scratch, ops)
        _all_reduce(message, world)
    alone = with_calls = 0.0
    for _ in range(IN_STEP_ROUNDS):
        timer.barrier()
        start = time.perf_counter()
        for _ in range(IN_STEP_CALLS):
            _host_work(scratch, ops)
        alone += time.perf_counter() - start
        timer.barrier()
        start = time.perf_counter()
        for _ in range(IN_STEP_CALLS):
            _host_work(scratch, ops)
            _all_reduce(message, world)
        timer.sync()
        with_calls += time.perf_counter() - start
    return max(with_calls - alone, 0.0) / (IN_STEP_ROUNDS * IN_STEP_CALLS)
