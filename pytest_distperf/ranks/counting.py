"""The counted generation: one more, untimed, this rank's work counted per token (`work.Work`).
A TorchDispatchMode sees every op that reaches the dispatcher, whoever issues it; where kernels
queue, torch.profiler counts kernels, their device time and the host's syncs with the device."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from pytest_distperf.platform import platform_of
from pytest_distperf.ranks.timing import GenerateFn, NextTokenFn, StepOverride, marked_generation
from pytest_distperf.work import CollectiveCount, PhaseWork, Work

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch < 2.5 keeps it private; a build without distributed has none
    try:
        from torch.distributed._tensor import DTensor
    except ImportError:
        DTensor = None

# The counter costs tens of microseconds per op, several times a small model's own step, and a
# warm generation's decode steps all do the same work: a few of them give the per-token figures.
COUNTED_DECODE_STEPS = 3

# Where a counted or profiled generation's phase begins: "prefill", "decode" (before every
# decode step) or None (the generation is over).
Mark = Callable[[str | None], None]
Generation = Callable[[Mark], None]

# Collective ops (namespace::name) by kind: c10d's in-place ops come from torch.distributed,
# FSDP1/2 and DDP; _c10d_functional's from DTensor, functional collectives and compiled graphs.
_KINDS: Mapping[str, tuple[str, ...]] = {
    "all_gather": (
        "c10d::_allgather_base_",
        "c10d::allgather_",
        "c10d::allgather_coalesced_",
        "c10d::allgather_into_tensor_coalesced_",
        "_c10d_functional::all_gather_into_tensor",
        "_c10d_functional::all_gather_into_tensor_out",
        "_c10d_functional::all_gather_into_tensor_coalesced",
    ),
    "reduce_scatter": (
        "c10d::_reduce_scatter_base_",
        "c10d::reduce_scatter_",
        "c10d::reduce_scatter_tensor_coalesced_",
        "_c10d_functional::reduce_scatter_tensor",
        "_c10d_functional::reduce_scatter_tensor_out",
        "_c10d_functional::reduce_scatter_tensor_coalesced",
    ),
    "all_reduce": (
        "c10d::allreduce_",
        "c10d::allreduce_coalesced_",
        "_c10d_functional::all_reduce",
        "_c10d_functional::all_reduce_",
        "_c10d_functional::all_reduce_coalesced",
        "_c10d_functional::all_reduce_coalesced_",
    ),
    "broadcast": (
        "c10d::broadcast_",
        "_c10d_functional::broadcast",
        "_c10d_functional::broadcast_",
    ),
    "all_to_all": (
        "c10d::alltoall_",
        "c10d::alltoall_base_",
        "_c10d_functional::all_to_all_single",
        "_dtensor::shard_dim_alltoall",
    ),
    "send": ("c10d::send", "_c10d_functional::isend"),
    "recv": ("c10d::recv_", "c10d::recv_any_source_", "_c10d_functional::irecv"),
    "reduce": ("c10d::reduce_",),
    "gather": ("c10d::gather_",),
    "scatter": ("c10d::scatter_",),
    "barrier": ("c10d::barrier", "c10d::monitored_barrier_"),
}
KIND_OF_OP: Mapping[str, str] = {op: kind for kind, ops in _KINDS.items() for op in ops}
COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")
# Waiting is no work of its own: the collective it waits for is counted.
_WAITS = frozenset({"_c10d_functional::wait_tensor", "c10d_functional::wait_tensor"})

_FLOPS: dict[Any, Callable[..., int]] = dict(flop_registry)
# The registry has no formula for CPU attention, whose shapes are those of the CUDA flash op.
if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _FLOPS[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = flop_registry[
        torch.ops.aten._scaled_dot_product_flash_attention
    ]
_PLAIN = (torch.Tensor, torch.nn.Parameter)


@dataclass(frozen=True)
class _Op:
    """What the counter does with one op overload (looked up once, the hot path is per op)."""

    kind: str | None  # a collective's kind
    aten: bool  # counted among the ops
    flops: Callable[..., int] | None


_OPS: dict[Any, _Op | None] = {}  # None: neither op nor collective (waits, other namespaces)


def _op(func: Any) -> _Op | None:
    if func in _OPS:
        return _OPS[func]
    name = func._schema.name  # "aten::mm": namespace::name, no overload
    namespace, short = name.split("::", 1)
    info: _Op | None = None
    if name in _WAITS:
        pass
    elif name in KIND_OF_OP or namespace in COLLECTIVE_NAMESPACES:
        info = _Op(KIND_OF_OP.get(name, short.rstrip("_")), False, None)
    elif namespace == "aten":
        info = _Op(None, True, _FLOPS.get(func._overloadpacket))
    _OPS[func] = info
    return info


def message_bytes(args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> int:
    """A collective's size as nccl-tests counts it (all_gather's output, reduce_scatter's input):
    the largest of its argument groups and its result, in-place and functional ops alike."""

    def size(value: Any) -> int:
        leaves = tree_leaves(value)
        return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))

    groups = [*args, *kwargs.values(), out]
    return max(size(group) for group in groups)


class _Tally:
    """One phase's totals over the steps counted in it."""

    __slots__ = ("collectives", "flops", "ops", "steps")

    def __init__(self) -> None:
        self.ops = 0
        self.flops = 0
        self.collectives: dict[str, list[int]] = {}  # kind -> [calls, bytes]
        self.steps = 0

    def work(self, steps: int, profiled: Profiled | None) -> PhaseWork:
        """Per step (decode token, or the one prefill); `profiled`: its kernels and syncs."""
        per = 1 / steps if steps else 0.0
        collectives = {
            kind: CollectiveCount(calls * per, size * per)
            for kind, (calls, size) in self.collectives.items()
        }
        if profiled is None:
            return PhaseWork(collectives, self.ops * per, self.flops * per)
        syncs = {kind: count * per for kind, count in profiled.syncs.items()}
        kernels = profiled.kernels * per
        return PhaseWork(collectives, self.ops * per, self.flops * per, kernels, syncs)


class WorkCounter(TorchDispatchMode):
    """Counts, per phase, the aten ops, FLOPs and collectives this process dispatches; `mark`
    starts a phase's next step. Every op runs, counted or not (`failure` says why not)."""

    def __init__(self) -> None:
        super().__init__()
        self.phases = {"prefill": _Tally(), "decode": _Tally(), "step": _Tally()}
        self._tally: _Tally | None = None
        self.failure: str | None = None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Otherwise torch.compile runs a compiled step eagerly under the mode, and never again
        # compiled after it.
        return True

    def mark(self, phase: str | None) -> None:
        self._tally = None if phase is None else self.phases[phase]
        if self._tally is not None:
            self._tally.steps += 1

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        plain = all(kind in _PLAIN for kind in types)
        if not plain and DTensor is not None and any(issubclass(t, DTensor) for t in types):
            # DTensor desugars into local ops and functional collectives, counted as they come.
            return NotImplemented
        out = func(*args, **kwargs)
        tally = self._tally
        if tally is None or self.failure is not None:
            return out
        if not plain and any(issubclass(t, FakeTensor) for t in types):
            return out  # DTensor's sharding propagation on fake tensors: no work
        try:
            self._count(tally, func, args, kwargs, out)
        except Exception as error:  # noqa: BLE001 - the op ran; only its count is lost
            self.failure = f"{func}: {error!r}"
        return out

    @staticmethod
    def _count(
        tally: _Tally, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any
    ) -> None:
        if isinstance(func, torch._ops.HigherOrderOperator):
            return
        info = _op(func)
        if info is None:
            return
        if info.kind is not None:
            count = tally.collectives.setdefault(info.kind, [0, 0])
            count[0] += 1
            count[1] += 0 if info.kind == "barrier" else message_bytes(args, kwargs, out)
            return
        tally.ops += 1
        if info.flops is not None:
            tally.flops += info.flops(*args, **kwargs, out_val=out)


@dataclass(frozen=True)
class DynamoMark:
    """Dynamo's running totals at one moment: graph breaks and frames compiled."""

    graph_breaks: int
    frames: int


def dynamo_mark() -> DynamoMark:
    """Dynamo's totals now (they run over the process's life: a pooled rank's earlier tests
    are in them, so a test reads differences)."""
    from torch._dynamo.utils import counters

    return DynamoMark(sum(counters["graph_break"].values()), counters["frames"]["total"])


@dataclass(frozen=True)
class Counted:
    """The counted generation of one rank."""

    work: Work
    device_time_per_token_s: float | None  # CUDA: summed kernel time per decode token


def count_work(
    model: Callable[..., torch.Tensor],
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    generate: GenerateFn | None = None,
    next_token: NextTokenFn | None = None,
    steps: StepOverride | None = None,
    compiled_since: DynamoMark | None = None,
) -> Counted:
    """Count one generation of `model` as the timed loop runs it (`generate`, `next_token`,
    `steps`), profiled too where kernels queue. `compiled_since`: dynamo's totals before
    compiling (None: eager). RuntimeError where the count failed."""
    # A user's loop has no known prefill/decode split: its whole generation counts as the
    # prefill and, divided by its new tokens, as each decode token.
    split = generate is None
    tokens = 1 + min(max_new_tokens - 1, COUNTED_DECODE_STEPS) if split else max_new_tokens

    def generation(mark: Mark) -> None:
        marked_generation(model, prompt, tokens, mark, generate, next_token, steps)
        mark(None)

    frames = dynamo_mark().frames if compiled_since is not None else 0
    queued = platform_of(prompt.device.type).queues_kernels
    counter, profiled = _counted(generation, queued)
    prefill = counter.phases["prefill"]
    prefill_profiled = profiled["prefill"] if profiled else None
    if split:
        decode, decode_steps = counter.phases["decode"], counter.phases["decode"].steps
        decode_profiled = profiled["decode"] if profiled else None
    else:
        decode, decode_steps, decode_profiled = prefill, tokens, prefill_profiled
    breaks = recompiles = None
    if compiled_since is not None:
        now = dynamo_mark()
        breaks, recompiles = now.graph_breaks - compiled_since.graph_breaks, now.frames - frames
    work = Work(
        decode=decode.work(decode_steps, decode_profiled),
        prefill=prefill.work(prefill.steps, prefill_profiled),
        graph_breaks=breaks,
        recompiles=recompiles,
    )
    device_time = None
    if decode_profiled is not None and decode_steps:
        device_time = decode_profiled.seconds / decode_steps
    return Counted(work, device_time)


def count_step(step: Callable[[], Any], queues_kernels: bool) -> Counted:
    """Count one training step as the timed ones run it (RuntimeError where it failed)."""

    def once(mark: Mark) -> None:
        mark("step")
        step()
        mark(None)

    counter, profiled = _counted(once, queues_kernels)
    step_profiled = profiled["step"] if profiled else None
    return Counted(Work(step=counter.phases["step"].work(1, step_profiled)), None)


def _counted(
    generation: Generation, profiled: bool
) -> tuple[WorkCounter, dict[str, Profiled] | None]:
    """`generation` run once, its ops counted and, where `profiled`, its kernels and syncs
    profiled in the same pass (the counter launches no kernel and makes no sync)."""
    counter = WorkCounter()

    def counted(profile_mark: Mark) -> None:
        def mark(phase: str | None) -> None:
            counter.mark(None)  # the profiler's own start and stop are no phase's work
            profile_mark(phase)
            if phase is not None:
                counter.mark(phase)

        with counter:
            generation(mark)

    found = profile_kernels(counted) if profiled else None
    if not profiled:
        counted(lambda phase: None)
    if counter.failure is not None:
        raise RuntimeError(f"counting the work failed at {counter.failure}")
    return counter, found


@dataclass(frozen=True)
class Profiled:
    """What one phase's profiled run saw on the device: kernels launched, their summed device
    seconds, and the host's syncs with the device by kind (`SYNC_KINDS`)."""

    kernels: int
    seconds: float
    syncs: Mapping[str, int]

    def __add__(self, other: Profiled) -> Profiled:
        syncs = dict(Counter(self.syncs) + Counter(other.syncs))
        return Profiled(self.kernels + other.kernels, self.seconds + other.seconds, syncs)


# The CUDA runtime's host-blocking syncs as the profiler's sync events name them. "Stream Wait
# Event" is left out: the device waits there, not the host.
SYNC_KINDS: Mapping[str, str] = {
    "Context Sync": "device synchronize",
    "Stream Sync": "stream synchronize",
    "Event Sync": "event synchronize",
}
_NOTHING = Profiled(0, 0.0, {})


def profile_kernels(generation: Generation) -> dict[str, Profiled]:
    """phase -> what one generation ran on the device (CUDA-graph replays too), less the session's
    own syncs: a CUDA-only profiler session per phase, far cheaper than tracing host ops."""
    found = {phase: _NOTHING for phase in ("prefill", "decode", "step")}
    open_session: list[tuple[str, Any]] = []
    own = _session_syncs()

    def close() -> None:
        phase, session = open_session.pop()
        found[phase] = found[phase] + _without(_stopped(session), own)

    def mark(phase: str | None) -> None:
        if open_session and open_session[-1][0] == phase:
            return  # the decode steps share one session
        if open_session:
            close()
        if phase is not None:
            open_session.append((phase, _started()))

    try:
        generation(mark)
    finally:
        if open_session:
            close()
    return found


def _started() -> Any:
    from torch.profiler import ProfilerActivity, profile

    config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    session = profile(activities=[ProfilerActivity.CUDA], experimental_config=config)
    with _quiet_profiler():
        session.start()
    return session


@contextlib.contextmanager
def _quiet_profiler() -> Iterator[None]:
    """Each session is read once before the next starts: that it clears its events is meant, and
    a user's `-W error` must not make the count fail for the profiler saying so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Warning: Profiler clears events", UserWarning)
        yield


def _stopped(session: Any) -> Profiled:
    torch.cuda.synchronize()  # a kernel still running when the session stops is lost
    with _quiet_profiler():
        session.stop()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        session.export_chrome_trace(str(path))
        return device_totals(json.loads(path.read_text())["traceEvents"])


@functools.cache  # per process: the same torch every time
def _session_syncs() -> Mapping[str, int]:
    """The syncs an empty profiler session records: every phase's session holds them too."""
    return _stopped(_started()).syncs


def _without(profiled: Profiled, own: Mapping[str, int]) -> Profiled:
    syncs = {kind: n - own.get(kind, 0) for kind, n in profiled.syncs.items()}
    return Profiled(profiled.kernels, profiled.seconds, {k: n for k, n in syncs.items() if n > 0})


def device_totals(events: list[dict[str, Any]]) -> Profiled:
    """Kernels, their summed seconds and host syncs by kind among a chrome trace's events."""
    durations = [e["dur"] for e in events if e.get("cat") == "kernel"]
    syncs = Counter(
        SYNC_KINDS[e["name"]]
        for e in events
        if e.get("cat") == "cuda_sync" and e.get("name") in SYNC_KINDS
    )
    return Profiled(len(durations), sum(durations) * 1e-6, dict(syncs))  # the trace's times: us


def warn(rank: int, error: BaseException) -> None:
    """The run goes on without its count: say so where the rank's output goes."""
    print(
        f"distperf: rank {rank}: counting the work failed, the run is reported without it: "
        f"{error!r}",
        file=sys.stderr,
        flush=True,
    )
