"""What the ranks measured and how the pytest process reduces it: one timed generation
(`Sample`), one rank's figures (`RankResult`), every rank's reduced to one row (`RunResult`).
Plain frozen dataclasses (picklable, no torch), so the plugin can read results without torch.

Each repeat's time is the slowest rank's, since the ranks advance in lock-step through
collectives; a rate is the median over repeats. What each figure counts: figures.py and
docs/running.md ("What is measured"); `replicas` is the run's independent decode streams
(every rank's under data parallelism, devices / group size under tensor or pipeline parallelism).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_distperf.figures import Figure, Source, figure, run_row
from pytest_distperf.reductions import slowest_known
from pytest_distperf.spec import RunSpec
from pytest_distperf.work import Work


@dataclass(frozen=True)
class Sample:
    """One timed generation on one rank, in seconds."""

    total_s: float  # prefill + decode: the seed's "Time for inference"
    # None for a user's own generation loop (`distperf(generate=...)`): its split is unknown.
    ttft_s: float | None  # to the first new token (prefill)
    decode_s: float | None  # the remaining max_new_tokens - 1 steps
    # The timing thread's wait for a core, and its time neither running nor runnable (a sleep,
    # a sync, I/O, a lock, a peer); None where the kernel keeps no such figures (hostspeed.py).
    queued_s: float | None = None
    off_cpu_s: float | None = None


@dataclass(frozen=True)
class Implementation:
    """What actually ran, so a figure can never be attributed to the wrong strategy."""

    fabric_strategy: str  # Fabric strategy class, e.g. "FSDPStrategy"
    sharding: str  # "replicated", "FSDP1 FULL_SHARD", "FSDP2 reshard_after_forward=True", ...
    backend: str  # torch.distributed backend, "" for one process
    wrapper: str  # class that wraps the model, e.g. "DistributedDataParallel"


@dataclass(frozen=True)
class RankResult:
    """One rank's figures; one reported under its own name is described in figures.py."""

    rank: int
    samples: tuple[Sample, ...]
    peak_memory_bytes: int
    memory_kind: str  # "cuda allocator peak" or "process RSS peak"
    implementation: Implementation
    versions: dict[str, str]
    device_name: str
    tokens: tuple[tuple[int, ...], ...]  # tokens of the last generation, per batch row
    replicas: int  # independent decode streams in the run
    timed_from: float  # epoch seconds when this rank began its timed generations
    reference_token_s: float | None = None  # see workload.reference_token_time
    reference_source: str = ""  # how the reference (token or step) was obtained; "" if none
    # The bare model's generation run right after each timed one (worker.py), when it has one.
    bare_samples: tuple[Sample, ...] = ()
    # Seconds of hostspeed's fixed interpreter loop, timed right after each timed generation.
    host_loop_s: tuple[float, ...] = ()
    # Its thread CPU seconds: the core's own speed, without the waits for a core.
    host_loop_cpu_s: tuple[float, ...] = ()
    calibration: Any = None  # perfmodel.Calibration when this run calibrated
    work_s: float | None = None  # on the test itself: build, calibration, timed, bare, ...
    compile_s: float | None = None  # compiling and settling the decode step (not timed)
    count_s: float | None = None  # the counted generation after the timed ones (not timed)
    reference_prefill_s: float | None = None  # the bare model's prefill (median of its runs)
    eager_reference: bool = False  # a compiled run whose reference is the eager model's
    compiled: str = ""  # how the decode step was compiled; "" for an eager run
    cuda_graphs: bool = False  # the timed steps replayed as CUDA graphs (compiled.py)
    graph_breaks: bool = False  # the timed steps compiled around the wrapper's hooks
    model_shape: Any = None  # perfmodel.ModelShape measured from the model this rank built
    # The counted generation's work per token (ranks/counting.py); None when off or failed.
    work: Work | None = None
    # A busy neighbour takes wall time from a rank, not CPU time; the waits say who took it.
    host_cpu_per_token_s: float | None = None
    run_queue_wait_per_token_s: float | None = None  # None where the kernel keeps none
    steal_per_token_s: float | None = None
    device_time_per_token_s: float | None = None  # CUDA; None on CPU
    # Training (None otherwise): the first step's loss, the loss before wrapping, the step alone.
    loss: float | None = None
    reference_loss: float | None = None
    reference_step_s: float | None = None
    # Training: this rank's measured dense matmul rate (FLOP/s) and how it was measured.
    matmul_flops_per_s: float | None = None
    matmul_source: str = ""
    # Training: model FLOPs of one step on one data-parallel rank's batch (perfmodel/train.py).
    model_flops_per_step: float | None = None
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds per phase (worker.py)


@dataclass(frozen=True)
class RunResult:
    """What `distperf.run()` returns: every rank's figures reduced to one row. Each figure that
    figures.py declares from the run is an attribute (`result.peak_memory_bytes`), reduced as
    declared there; the properties here hold the arithmetic those declarations read."""

    spec: RunSpec
    ranks: tuple[RankResult, ...]
    launch_s: float  # wall time of the whole launch, process start to last rank exit
    launched_at: float  # epoch seconds when the launch began
    extras: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        # Only for a name that is no field or property: a property's own AttributeError stays.
        declared = None if name.startswith("_") or hasattr(type(self), name) else _figure(name)
        if declared is None:
            raise AttributeError(f"{type(self).__name__} has no attribute or figure {name!r}")
        return declared.reduce.compute(self)

    @property
    def samples(self) -> tuple[Sample, ...]:
        """Per repeat, the slowest rank's sample (the step is as slow as its slowest member)."""
        return slowest_per_repeat(self._per_rank)

    @property
    def training(self) -> bool:
        return self.spec.workload.training

    @property
    def new_tokens(self) -> int:
        """Tokens one timed repeat yields: a generation's new tokens on one rank; a training
        step's tokens over every data-parallel replica."""
        workload = self.spec.workload
        if workload.training:
            return self.ranks[0].replicas * workload.batch_size * (workload.seq_length or 0)
        return workload.max_new_tokens * workload.batch_size

    @property
    def tokens_per_sec_samples(self) -> tuple[float, ...]:
        return tuple(self.new_tokens / s.total_s for s in self.samples)

    @property
    def tokens_per_sec(self) -> float:
        return statistics.median(self.tokens_per_sec_samples)

    @property
    def decode_tokens_per_sec(self) -> float | None:
        steps = (self.spec.workload.max_new_tokens - 1) * self.spec.workload.batch_size
        decode = [s.decode_s for s in self.samples]
        return _median([steps / s for s in decode] if steps and None not in decode else None)

    @property
    def ttft_s(self) -> float | None:
        ttft = [s.ttft_s for s in self.samples]
        return _median(None if None in ttft else ttft)

    @property
    def aggregate_tokens_per_sec(self) -> float:
        if self.training:  # a step's tokens count every replica already
            return self.tokens_per_sec
        return self.ranks[0].replicas * self.tokens_per_sec

    @property
    def step_time_s(self) -> float | None:
        """Training: the median over repeats of the slowest rank's optimizer step."""
        return _median([s.total_s for s in self.samples] if self.training else None)

    @property
    def peak_flops(self) -> float | None:
        """Training: the summed dense matmul rate the ranks measured (MFU's denominator)."""
        rates = [r.matmul_flops_per_s for r in self.ranks]
        return None if not rates or None in rates else float(sum(rates))  # type: ignore[arg-type]

    @property
    def model_flops_per_step(self) -> float | None:
        """Training: model FLOPs of one step over every data-parallel replica."""
        flops = self.ranks[0].model_flops_per_step
        return None if flops is None else flops * self.ranks[0].replicas

    @property
    def mfu(self) -> float | None:
        """Training: model FLOPs per second over the ranks' summed measured matmul rate."""
        flops, peak, step = self.model_flops_per_step, self.peak_flops, self.step_time_s
        return None if flops is None or not peak or not step else flops / step / peak

    @property
    def startup_s(self) -> float:
        """Fixed cost of the test: launch to first timed token (spawn, imports, rendezvous,
        Fabric, model build, warm-up), as the slowest rank saw it."""
        return max(r.timed_from for r in self.ranks) - self.launched_at

    @property
    def harness_s(self) -> float | None:
        """What the launch cost beyond the test's own work: starting ranks, messages, waits."""
        work_s = self.work_s
        return None if work_s is None else max(self.launch_s - work_s, 0.0)

    @property
    def reference_prefill_s(self) -> float | None:
        """The slowest prefill of the whole model alone of the ranks that timed one."""
        return slowest_known(r.reference_prefill_s for r in self.ranks)

    @property
    def eager_reference(self) -> bool:
        """Some rank's compiled run had no compiled whole copy beside it: its reference is the
        eager model's step."""
        return any(r.eager_reference for r in self.ranks)

    @property
    def relative_speed_samples(self) -> tuple[float, ...]:
        """Per repeat: the bare model's generation time over the wrapped one's. A host whose
        speed drifts moves both alike."""
        return bare_over_wrapped([r.bare_samples for r in self.ranks], self._per_rank)

    @property
    def relative_speed_unqueued_samples(self) -> tuple[float, ...]:
        """The same with each side's wait for a core taken out of its time."""
        return bare_over_wrapped([r.bare_samples for r in self.ranks], self._per_rank, unqueued)

    @property
    def relative_speed(self) -> float | None:
        return _median(self.relative_speed_samples or None)

    @property
    def off_cpu_share(self) -> float | None:
        return _median(off_cpu_shares(self._per_rank) or None)

    @property
    def host_loop_samples(self) -> tuple[float, ...]:
        """Per repeat, the slowest rank's time for the host-speed loop (hostspeed.py): the
        speed of the machine itself beside each sample; empty when some rank has none."""
        return slowest_per_repeat_of([r.host_loop_s for r in self.ranks], self.spec.repeats)

    @property
    def host_loop_cpu_samples(self) -> tuple[float, ...]:
        """Per repeat, the slowest rank's CPU time for that loop: how fast its core ran when
        it ran (a neighbour on a shared core slows it too); empty when some rank has none."""
        return slowest_per_repeat_of([r.host_loop_cpu_s for r in self.ranks], self.spec.repeats)

    @property
    def _per_rank(self) -> list[tuple[Sample, ...]]:
        return [r.samples for r in self.ranks]

    @property
    def calibration(self) -> Any:
        return self.ranks[0].calibration

    @property
    def tokens(self) -> tuple[tuple[int, ...], ...]:
        return self.ranks[0].tokens

    def summary(self) -> dict[str, Any]:
        """A JSON-able row for reports: every figure that figures.py declares for the JSON
        report and computes from the run, under the same keys as --distperf-json, then
        `extras`."""
        return {**run_row(self), **self.extras}


def _median(values: Sequence[float] | None) -> float | None:
    return None if values is None else statistics.median(values)


def _figure(name: str) -> Figure | None:
    """The figure of that name that figures.py reduces from the run; None for any other."""
    try:
        declared = figure(name)
    except KeyError:
        return None
    return declared if declared.source is Source.RUN else None


def slowest_per_repeat(per_rank: Iterable[Sequence[Sample]]) -> tuple[Sample, ...]:
    """Per repeat, the slowest rank's sample: the ranks advance in lock-step."""
    return tuple(max(group, key=lambda s: s.total_s) for group in zip(*per_rank, strict=True))


def unqueued(sample: Sample) -> float:
    """The time without its wait for a core: what a busy neighbour cannot have added."""
    return sample.total_s - (sample.queued_s or 0.0)


def bare_over_wrapped(
    bare: Sequence[Sequence[Sample]],
    wrapped: Sequence[Sequence[Sample]],
    time: Callable[[Sample], float] = lambda sample: sample.total_s,
) -> tuple[float, ...]:
    """Per repeat, the bare model's time over the wrapped one's (slowest rank's of each):
    0.3 = the strategy runs at 30% of the bare model's speed; empty when some rank had no
    bare model."""
    if not all(bare):
        return ()
    pairs = zip(slowest_per_repeat(bare), slowest_per_repeat(wrapped), strict=True)
    return tuple(time(b) / time(w) for b, w in pairs)


def off_cpu_shares(per_rank: Sequence[Sequence[Sample]]) -> tuple[float, ...]:
    """Per repeat, the largest share of a rank's timed generation its timing thread spent off
    the CPU by its own doing (a sleep, a sync, I/O, a lock, a peer): the rank that waited
    most; empty where some rank has no such figure."""
    if not per_rank or any(s.off_cpu_s is None for rank in per_rank for s in rank):
        return ()
    return tuple(
        max((s.off_cpu_s or 0.0) / s.total_s for s in repeat)
        for repeat in zip(*per_rank, strict=True)
    )


def slowest_per_repeat_of(per_rank: Sequence[Sequence[float]], repeats: int) -> tuple[float, ...]:
    """Per repeat, the largest of the ranks' values; empty when some rank has not one per
    repeat."""
    if not all(len(values) == repeats for values in per_rank):
        return ()
    return tuple(max(values) for values in zip(*per_rank, strict=True))
