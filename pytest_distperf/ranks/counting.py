"""The counted generation: one more, untimed, this rank's work counted per token (`work.Work`).
A TorchDispatchMode sees every op that reaches the dispatcher, whoever issues it; where kernels
queue, torch.profiler counts kernels, their device time and the host's syncs with the device."""

from __future__ import annotations

import contextlib
import functools
import json
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

# Collective kinds by a word in their op's name, underscores left out: c10d's in-place ops come
# from torch.distributed, FSDP and DDP; the functional ones from DTensor and compiled graphs.
_KIND_WORDS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    *((word, word) for word in ("broadcast", "send", "recv", "barrier", "reduce", "gather")),
    ("scatter", "scatter"),
)
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


def collective_kind(name: str) -> str | None:
    """The kind of the collective op `name` ("c10d::allreduce_"), None for any other op."""
    namespace, short = name.split("::", 1)
    if namespace not in COLLECTIVE_NAMESPACES and name != "_dtensor::shard_dim_alltoall":
        return None
    word = short.replace("_", "")
    return next((kind for part, kind in _KIND_WORDS if part in word), short.rstrip("_"))


@dataclass(frozen=True)
class _Op:
    """What the counter does with one op overload: count a collective, or an op and its FLOPs."""

    kind: str | None  # a collective's kind; None: an aten op
    flops: Callable[..., int] | None = None


@functools.cache  # per op overload: the counter's hot path is per op
def _op(func: Any) -> _Op | None:
    """None: neither an aten op nor a collective (waits, other namespaces)."""
    name = func._schema.name  # "aten::mm": namespace::name, no overload
    if name in _WAITS:
        return None
    kind = collective_kind(name)
    if kind is not None:
        return _Op(kind)
    return _Op(None, _FLOPS.get(func._overloadpacket)) if name.startswith("aten::") else None


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

    __slots__ = ("collectives", "flops", "ops", "profiled", "steps")

    def __init__(self) -> None:
        self.ops = 0
        self.flops = 0
        self.collectives: dict[str, list[int]] = {}  # kind -> [calls, bytes]
        self.steps = 0
        self.profiled: Profiled | None = None  # its kernels and syncs, where kernels queue

    def work(self, steps: int) -> PhaseWork:
        """Per step: a decode token, or the one prefill."""
        per = 1 / steps if steps else 0.0
        counts = self.collectives.items()
        collectives = {kind: CollectiveCount(n * per, size * per) for kind, (n, size) in counts}
        if self.profiled is None:
            return PhaseWork(collectives, self.ops * per, self.flops * per)
        syncs = {kind: count * per for kind, count in self.profiled.syncs.items()}
        kernels = self.profiled.kernels * per
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
        return True  # else torch.compile runs a compiled step eagerly under the mode, ever after

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
        if isinstance(func, torch._ops.HigherOrderOperator):
            return out
        try:
            info = _op(func)
            if info is not None and info.kind is not None:
                count = tally.collectives.setdefault(info.kind, [0, 0])
                count[0] += 1
                count[1] += 0 if info.kind == "barrier" else message_bytes(args, kwargs, out)
            elif info is not None:
                tally.ops += 1
                tally.flops += info.flops(*args, **kwargs, out_val=out) if info.flops else 0
        except Exception as error:  # noqa: BLE001 - the op ran; only its count is lost
            self.failure = f"{func}: {error!r}"
        return out


@dataclass(frozen=True)
class DynamoMark:
    """Dynamo's running totals at one moment: graph breaks and frames compiled."""

    graph_breaks: int
    frames: int


def dynamo_mark() -> DynamoMark:
    """Dynamo's totals now, over the process's life (a test reads differences)."""
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
    """Count one generation as the timed loop runs it, profiled too where kernels queue.
    `compiled_since`: dynamo's totals before compiling (None: eager). RuntimeError on failure."""
    # A user's loop has no known prefill/decode split: its whole generation counts as the
    # prefill and, divided by its new tokens, as each decode token.
    split = generate is None
    tokens = 1 + min(max_new_tokens - 1, COUNTED_DECODE_STEPS) if split else max_new_tokens

    def generation(mark: Mark) -> None:
        marked_generation(model, prompt, tokens, mark, generate, next_token, steps)
        mark(None)

    frames = dynamo_mark().frames if compiled_since is not None else 0
    counted = _counted(generation, platform_of(prompt.device.type).queues_kernels)
    prefill = counted["prefill"]
    decode = counted["decode"] if split else prefill
    decode_steps = decode.steps if split else tokens
    breaks = recompiles = None
    if compiled_since is not None:
        now = dynamo_mark()
        breaks, recompiles = now.graph_breaks - compiled_since.graph_breaks, now.frames - frames
    work = Work(decode.work(decode_steps), prefill.work(prefill.steps), breaks, recompiles)
    device_time = None
    if decode.profiled is not None and decode_steps:
        device_time = decode.profiled.seconds / decode_steps
    return Counted(work, device_time)


def count_step(step: Callable[[], Any], queues_kernels: bool) -> Counted:
    """Count one training step as the timed ones run it (RuntimeError where it failed)."""

    def once(mark: Mark) -> None:
        mark("step")
        step()
        mark(None)

    return Counted(Work(step=_counted(once, queues_kernels)["step"].work(1)), None)


def _counted(generation: Generation, profiled: bool) -> dict[str, _Tally]:
    """phase -> its tally of `generation` run once and, where `profiled`, its kernels and syncs
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

    if profiled:
        for phase, found in profile_kernels(counted).items():
            counter.phases[phase].profiled = found
    else:
        counted(lambda phase: None)
    if counter.failure is not None:
        raise RuntimeError(f"counting the work failed at {counter.failure}")
    return counter.phases


@dataclass(frozen=True)
class Profiled:
    """One phase's kernels, their summed device seconds, and host syncs by kind (`SYNC_KINDS`)."""

    kernels: int
    seconds: float
    syncs: Mapping[str, int]


# The CUDA runtime's host-blocking syncs as the profiler's sync events name them. "Stream Wait
# Event" is left out: the device waits there, not the host.
SYNC_KINDS: Mapping[str, str] = {
    "Context Sync": "device synchronize",
    "Stream Sync": "stream synchronize",
    "Event Sync": "event synchronize",
}
_NOTHING = Profiled(0, 0.0, {})


def profile_kernels(generation: Generation) -> dict[str, Profiled]:
    """phase -> what one generation ran on the device, less the session's own syncs: a CUDA-only
    profiler session per phase, far cheaper than tracing host ops."""
    found = {phase: _NOTHING for phase in ("prefill", "decode", "step")}
    open_session: list[tuple[str, Any]] = []  # (phase, its session) while one is open
    own = _session_syncs()

    def mark(phase: str | None) -> None:
        if open_session and open_session[-1][0] == phase:
            return  # the decode steps share one session
        if open_session:
            ended, session = open_session.pop()
            found[ended] = _without(_stopped(session), own)  # one session a phase
        if phase is not None:
            open_session.append((phase, _started()))

    try:
        generation(mark)
    finally:
        mark(None)
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
