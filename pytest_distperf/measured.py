"""What the ranks measured (`Sample`, `RankResult`) and the run's figures reduced from every
rank's (`RunResult`, by `reduce_ranks`; docs/running.md says what each counts). No torch."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from pytest_distperf.jsonfields import json_value
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.work import Work, busiest, max_known


@dataclass(frozen=True)
class Sample:
    """One timed generation on one rank, in seconds."""

    total_s: float  # prefill + decode: the seed's "Time for inference"
    # None for a user's own generation loop (`distperf(generate=...)`): its split is unknown.
    ttft_s: float | None  # to the first new token (prefill)
    decode_s: float | None  # the remaining max_new_tokens - 1 steps
    # The timing thread's wait for a core, and its time off the CPU by its own doing (a sleep,
    # a sync, I/O, a peer); None where the kernel keeps no such figures (hostspeed.py).
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
    """One rank's figures (`replicas`: the run's independent decode streams)."""

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
    bare_samples: tuple[Sample, ...] = ()
    host_loop_s: tuple[float, ...] = ()  # hostspeed's loop after each timed generation
    host_loop_cpu_s: tuple[float, ...] = ()  # its CPU seconds: the core's own speed
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
    work: Work | None = None  # ranks/counting.py; None when off or failed
    # A busy neighbour takes wall time from a rank, not CPU time; the waits say who took it.
    host_cpu_per_token_s: float | None = None
    run_queue_wait_per_token_s: float | None = None  # None where the kernel keeps none
    steal_per_token_s: float | None = None
    device_time_per_token_s: float | None = None  # CUDA; None on CPU
    # CPU ranks, tp: one all-reduce between the model's layers, timed before wrapping.
    in_step_collective_s: float | None = None
    # Training (None otherwise): the first step's loss, the loss before wrapping, the step alone.
    loss: float | None = None
    reference_loss: float | None = None
    reference_step_s: float | None = None
    matmul_flops_per_s: float | None = None  # training: this rank's dense matmul FLOP/s
    matmul_source: str = ""
    # Training: model FLOPs of one step on one data-parallel rank's batch (perfmodel/train.py).
    model_flops_per_step: float | None = None
    phase_s: dict[str, float] = field(default_factory=dict)  # seconds per phase (worker.py)


def _reduced() -> Any:
    return field(init=False)  # set once, from every rank's results, by `reduce_ranks`


@dataclass(frozen=True)
class RunResult:
    """What `distperf.run()` returns: the run's figures, each reduced once by `reduce_ranks`;
    `to_dict()` is its JSON row (the keys of --distperf-json)."""

    spec: RunSpec  # what the test asked for
    ranks: tuple[RankResult, ...]  # every rank's results, by rank
    launch_s: float  # the launch's wall time, process start to last rank exit
    launched_at: float  # epoch seconds when the launch began
    samples: tuple[Sample, ...] = _reduced()  # per repeat, the slowest rank's
    # What was asked (the spec's).
    test_id: str = _reduced()
    strategy: str = _reduced()
    devices: int = _reduced()
    accelerator: str = _reduced()  # "cpu" or "cuda"
    model_source: str = _reduced()  # "preset", "litgpt", "hf" or "builder"
    nodes: int = _reduced()  # hosts the ranks ran on
    mode: str = _reduced()  # "generate" or "train"
    workload: Workload = _reduced()
    repeats: int = _reduced()  # timed generations (training: steps)
    warmup: int = _reduced()  # untimed ones before them
    # Rates: median of repeats, each repeat the slowest rank's.
    tokens_per_sec: float = _reduced()  # a generation's new tokens over its wall time
    tokens_per_sec_samples: tuple[float, ...] = _reduced()  # tokens_per_sec of each repeat
    decode_tokens_per_sec: float | None = _reduced()  # decode steps' tokens over decode time
    ttft_s: float | None = _reduced()  # time to the first new token (prefill)
    aggregate_tokens_per_sec: float = _reduced()  # every independent stream's tokens
    relative_speed: float | None = _reduced()  # bare model's time / wrapped one's
    relative_speed_samples: tuple[float, ...] = _reduced()  # relative_speed of each repeat
    # Training (None in generate mode): the step, its model FLOPs and loss.
    step_time_s: float | None = _reduced()  # one optimizer step
    mfu: float | None = _reduced()  # model FLOPs per second over the ranks' summed matmul rate
    loss: float | None = _reduced()  # the first step's loss on data-parallel rank 0's batch
    reference_loss: float | None = _reduced()  # the same weights' and batch's loss in one process
    reference_step_s: float | None = _reduced()  # the whole model's step alone, before wrapping
    model_flops_per_step: float | None = _reduced()  # over every data-parallel replica
    peak_flops: float | None = _reduced()  # the ranks' summed matmul rate (MFU's)
    peak_flops_source: str | None = _reduced()  # how that rate was measured
    # What ran and what it held.
    implementation: Implementation = _reduced()
    device_name: str = _reduced()
    versions: dict[str, str] = _reduced()  # package versions in the ranks
    compiled: str = _reduced()  # how the step was compiled; "" eager
    cuda_graphs: bool = _reduced()  # every rank replayed the timed steps as CUDA graphs
    graph_breaks: bool = _reduced()  # some rank compiled around the wrapper's hooks
    peak_memory_bytes: int = _reduced()  # the busiest rank's peak
    peak_memory_per_rank: tuple[int, ...] = _reduced()
    memory_kind: str = _reduced()  # what the peak measures
    # The counted generation and the machine beside the repeats: the slowest rank's.
    work: Work | None = _reduced()  # collectives, ops, FLOPs, kernels per token
    device_time_per_token_s: float | None = _reduced()  # kernel time per decode token (CUDA)
    host_cpu_per_token_s: float | None = _reduced()  # process CPU time per new token
    run_queue_wait_per_token_s: float | None = _reduced()  # threads' wait for a core
    steal_per_token_s: float | None = _reduced()  # the hypervisor's steal per CPU per token
    off_cpu_share: float | None = _reduced()  # of a repeat, by its own doing
    host_loop_samples: tuple[float, ...] = _reduced()  # the host-speed loop beside each repeat
    host_loop_cpu_samples: tuple[float, ...] = _reduced()  # its CPU time: the core's speed
    reference_token_s: float | None = _reduced()  # per-token time of the whole model alone
    reference_source: str = _reduced()  # how the reference was obtained
    # Where the time went.
    startup_s: float = _reduced()  # launch to the first timed token
    work_s: float | None = _reduced()  # a rank's time on the test
    harness_s: float | None = _reduced()  # launch_s - work_s: what the launch cost beyond the test
    compile_s: float | None = _reduced()  # compiling the step
    count_s: float | None = _reduced()  # the counted generation after the timed ones
    phase_s: dict[str, float] = _reduced()  # seconds of each phase of the test

    def __post_init__(self) -> None:
        reduced = reduce_ranks(self.spec, self.ranks, self.launch_s, self.launched_at)
        figures = {f.name for f in fields(self) if not f.init}
        if reduced.keys() != figures:  # a field without its reduction, or the other way round
            raise TypeError(
                f"RunResult and reduce_ranks differ: {sorted(figures ^ reduced.keys())}"
            )
        for name, value in reduced.items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """Every figure under its name, as plain JSON (--distperf-json adds the gate's)."""
        raw = ("spec", "ranks", "launched_at", "samples")
        return {
            f.name: json_value(getattr(self, f.name)) for f in fields(self) if f.name not in raw
        }

    @property
    def training(self) -> bool:
        return self.spec.workload.training

    @property
    def new_tokens(self) -> int:
        """Tokens of one timed repeat: a generation's on one rank, a step's on every replica."""
        return _new_tokens(self.spec, self.ranks[0].replicas)

    @property
    def in_step_collective_s(self) -> float | None:
        """The largest cost of one collective between host-run layers the ranks timed."""
        return max_known(r.in_step_collective_s for r in self.ranks)

    @property
    def reference_prefill_s(self) -> float | None:
        """The slowest prefill of the whole model alone of the ranks that timed one."""
        return max_known(r.reference_prefill_s for r in self.ranks)

    @property
    def eager_reference(self) -> bool:
        """Some rank's compiled run has the eager model's step as its reference."""
        return any(r.eager_reference for r in self.ranks)

    @property
    def relative_speed_unqueued_samples(self) -> tuple[float, ...]:
        """relative_speed_samples with each side's wait for a core taken out of its time."""
        bare = [r.bare_samples for r in self.ranks]
        return bare_over_wrapped(bare, [r.samples for r in self.ranks], unqueued)

    @property
    def calibration(self) -> Any:
        return self.ranks[0].calibration

    @property
    def tokens(self) -> tuple[tuple[int, ...], ...]:
        return self.ranks[0].tokens


def reduce_ranks(
    spec: RunSpec, ranks: tuple[RankResult, ...], launch_s: float, launched_at: float
) -> dict[str, Any]:
    """Every figure of `RunResult` from every rank's results: the one place each is reduced."""
    workload, first = spec.workload, ranks[0]
    training = workload.training
    per_rank = [r.samples for r in ranks]
    samples = slowest_per_repeat(per_rank)
    new_tokens = _new_tokens(spec, first.replicas)
    rates = tuple(new_tokens / s.total_s for s in samples)
    tokens_per_sec = statistics.median(rates)
    steps = (workload.max_new_tokens - 1) * workload.batch_size
    decode, ttft = [s.decode_s for s in samples], [s.ttft_s for s in samples]
    # None for a user's own generation loop: its split is unknown
    decode_rates = [steps / s for s in decode] if steps and None not in decode else None
    relative = bare_over_wrapped([r.bare_samples for r in ranks], per_rank)
    work_s = slowest(r.work_s for r in ranks)
    return dict(
        samples=samples,
        **{name: getattr(spec, name) for name in _ASKED},
        mode=workload.mode,
        tokens_per_sec=tokens_per_sec,
        tokens_per_sec_samples=rates,
        decode_tokens_per_sec=_median(decode_rates),  # type: ignore[arg-type]
        ttft_s=_median(None if None in ttft else ttft),  # type: ignore[arg-type]
        # a training step's tokens count every replica already
        aggregate_tokens_per_sec=tokens_per_sec * (1 if training else first.replicas),
        relative_speed=_median(relative or None),
        relative_speed_samples=relative,
        **_training_figures(training, ranks, samples),
        implementation=first.implementation,
        device_name=first.device_name,
        versions=first.versions,
        compiled=first.compiled,
        cuda_graphs=all(r.cuda_graphs for r in ranks),
        graph_breaks=any(r.graph_breaks for r in ranks),
        peak_memory_bytes=max(r.peak_memory_bytes for r in ranks),
        peak_memory_per_rank=tuple(r.peak_memory_bytes for r in ranks),
        memory_kind=first.memory_kind,
        work=slowest((r.work for r in ranks), busiest),
        device_time_per_token_s=slowest(r.device_time_per_token_s for r in ranks),
        host_cpu_per_token_s=slowest(r.host_cpu_per_token_s for r in ranks),
        run_queue_wait_per_token_s=slowest(r.run_queue_wait_per_token_s for r in ranks),
        steal_per_token_s=slowest(r.steal_per_token_s for r in ranks),
        off_cpu_share=_median(off_cpu_shares(per_rank) or None),
        host_loop_samples=slowest_per_repeat_of([r.host_loop_s for r in ranks], spec.repeats),
        host_loop_cpu_samples=slowest_per_repeat_of(
            [r.host_loop_cpu_s for r in ranks], spec.repeats
        ),
        # the whole model timed alone (or compiled): any rank's stands for the run's
        reference_token_s=max_known(r.reference_token_s for r in ranks),
        reference_source=first.reference_source,
        startup_s=max(r.timed_from for r in ranks) - launched_at,
        work_s=work_s,
        harness_s=None if work_s is None else max(launch_s - work_s, 0.0),
        compile_s=max_known(r.compile_s for r in ranks),
        count_s=slowest(r.count_s for r in ranks),
        phase_s=_slowest_phases([r.phase_s for r in ranks]),
    )


# RunResult's figures that are the spec's own.
_ASKED = (
    "test_id", "strategy", "devices", "accelerator", "model_source", "nodes", "workload",
    "repeats", "warmup",
)  # fmt: skip


def _training_figures(
    training: bool, ranks: tuple[RankResult, ...], samples: tuple[Sample, ...]
) -> dict[str, Any]:
    """A training step's figures; None (the loss: the ranks' own) for a generation."""
    first = ranks[0]
    step_time_s = _median([s.total_s for s in samples] if training else None)
    flops = first.model_flops_per_step
    model_flops = None if flops is None else flops * first.replicas
    matmul = [r.matmul_flops_per_s for r in ranks]
    peak_flops = None if None in matmul else float(sum(matmul))  # type: ignore[arg-type]
    known = model_flops is not None and peak_flops and step_time_s
    return dict(
        step_time_s=step_time_s,
        mfu=model_flops / step_time_s / peak_flops if known else None,  # type: ignore[operator]
        loss=first.loss,
        reference_loss=first.reference_loss,
        reference_step_s=slowest(r.reference_step_s for r in ranks),
        model_flops_per_step=model_flops,
        peak_flops=peak_flops,
        peak_flops_source=first.matmul_source if training else None,
    )


def _new_tokens(spec: RunSpec, replicas: int) -> int:
    workload = spec.workload
    if workload.training:
        return replicas * workload.batch_size * (workload.seq_length or 0)
    return workload.max_new_tokens * workload.batch_size


def _median(values: Sequence[float] | None) -> float | None:
    return None if values is None else statistics.median(values)


def slowest(values: Iterable[Any], largest: Callable[[list[Any]], Any] = max) -> Any:
    """The largest of every rank's (`largest`: how, for a record); None when some rank has none,
    since that rank may have been the slowest."""
    known = list(values)
    return None if not known or None in known else largest(known)


def _slowest_phases(per_rank: Sequence[dict[str, float]]) -> dict[str, float]:
    """Seconds of each phase, the slowest rank's; {} where some rank reported none."""
    if not per_rank or not all(per_rank):
        return {}
    names = dict.fromkeys(name for phases in per_rank for name in phases)
    return {name: max(phases.get(name, 0.0) for phases in per_rank) for name in names}


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
    """Per repeat, the bare model's time over the wrapped one's (slowest rank's of each; 0.3: at
    30% of the bare model's speed); empty when some rank had no bare model."""
    if not all(bare):
        return ()
    pairs = zip(slowest_per_repeat(bare), slowest_per_repeat(wrapped), strict=True)
    return tuple(time(b) / time(w) for b, w in pairs)


def off_cpu_shares(per_rank: Sequence[Sequence[Sample]]) -> tuple[float, ...]:
    """Per repeat, the largest share of a rank's timed generation spent off the CPU by its own
    doing (Sample.off_cpu_s); empty where some rank has no such figure."""
    shares = [
        [s.off_cpu_s / s.total_s for s in rank if s.off_cpu_s is not None] for rank in per_rank
    ]
    return slowest_per_repeat_of(shares, len(per_rank[0]) if per_rank else 0)


def slowest_per_repeat_of(per_rank: Sequence[Sequence[float]], repeats: int) -> tuple[float, ...]:
    """Per repeat, the largest of the ranks' values; empty unless each rank has one per repeat."""
    if not all(len(values) == repeats for values in per_rank):
        return ()
    return tuple(max(values) for values in zip(*per_rank, strict=True))
