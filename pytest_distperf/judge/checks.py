"""Decisions on one run: below the topology-aware threshold, regressed against the baseline,
stale baseline, memory growth, or fine; each with the message a user acts on.

Small check functions that return a `Check` (pytest-benchmark's `fails()` idea, with a status
instead of None so that passing runs carry their figures too). Pure: no I/O, no pytest. The
figures are typed per kind of check; record.py turns them into report fields.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pytest_distperf.judge.stats import (
    Comparison,
    Verdict,
    compare_memory,
    compare_to_recorded_runs,
)
from pytest_distperf.judge.tolerance import (
    RUNS_FOR_SETTLED_FLOOR,
    detectable_drop,
)
from pytest_distperf.store.entry import BaselineEntry


class CheckStatus(str, enum.Enum):
    """How a check came out; the value is the word the reports carry."""

    OK = "ok"
    NOTE = "note"  # nothing to judge (no prediction, no baseline): the message says why
    WARN = "warn"  # reported, not failing
    FAIL = "fail"
    SKIP = "skip"  # not run: a baseline update compares with nothing

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, word: object, where: str) -> CheckStatus:
        """The status a saved report wrote; "pass" is how reports wrote `OK` before."""
        try:
            return cls.OK if word == "pass" else cls(word)
        except ValueError:
            words = ", ".join(status.value for status in cls)
            raise ValueError(f"{where}: unknown check status {word!r} ({words})") from None


CheckName = Literal[
    "threshold", "baseline", "relative_speed", "memory", "work", "device_time", "loss"
]
CHECK_NAMES: tuple[CheckName, ...] = get_args(CheckName)  # in the order a reader wants them
#: A comparison's verdict, or the machine or busy check's excuse for a regression.
BaselineVerdict = Literal[Verdict, "machine slower", "machine busy"]
MACHINE_SLOWER: BaselineVerdict = "machine slower"
MACHINE_BUSY: BaselineVerdict = "machine busy"


# Which check judged a threshold (judge/threshold.py): the run's step timed again, or the model.
RETIMING = "re-timing"
MODELLED = "model"


@dataclass(frozen=True)
class ThresholdFigures:
    predicted_tokens_per_sec: float
    threshold_tokens_per_sec: float
    efficiency: float
    bound: str
    bound_description: str
    link_class: str
    ratio_to_predicted: float
    check: str = MODELLED  # or RETIMING: which one judged


@dataclass(frozen=True)
class MachineFigures:
    """The machine check's figures: relative changes of speed against the baseline's."""

    bare_change: float  # the bare model timed beside each repeat
    host_change: float  # the host-speed loop (hostspeed.py): the machine itself
    change_beyond_host: float  # the throughput's, with the host's taken out


@dataclass(frozen=True)
class BusyEvidence:
    """What something outside the rank measurably took from it per new token, beyond what it
    took when the baseline was recorded (judge/busy.py); None where not measured."""

    run_queue_wait_per_token_s: float | None  # its threads runnable, waiting for a core
    steal_per_token_s: float | None  # the hypervisor ran another guest (per CPU)
    core_slowdown: float | None  # the fixed loop's CPU time over the baseline's, >= 1

    @property
    def outside_s(self) -> float:
        """Time per token taken outright: the wait for a core and the steal."""
        return (self.run_queue_wait_per_token_s or 0.0) + (self.steal_per_token_s or 0.0)


NO_EVIDENCE = BusyEvidence(None, None, None)


@dataclass(frozen=True)
class BusyFigures:
    """The busy check's figures: changes against the baseline's, and the evidence weighed."""

    wall_change: float  # wall time per token: positive when slower
    host_cpu_change: float | None  # process CPU time per token, where both sides have it
    host_cpu_tolerance: float | None  # what the CPU time may move by itself
    evidence: BusyEvidence = NO_EVIDENCE
    explained_share: float = 0.0  # of the lost time, what the evidence accounts for
    change_beyond_evidence: float | None = None  # the wall time's change with it taken out


@dataclass(frozen=True)
class WaitFigures:
    """The ranks' own waits (judge/waits.py): shares of the wall time of a generation."""

    off_cpu_share: float  # the rank that waited most, median of the repeats
    baseline_off_cpu_share: float  # the recorded runs' level
    rise: float  # off_cpu_share - baseline_off_cpu_share
    tolerance: float
    outside_share: float  # what the busy evidence took (run queue, steal), taken off the rise


@dataclass(frozen=True)
class BaselineFigures:
    baseline_tokens_per_sec: float
    change: float
    tolerance: float
    tolerance_runs: int
    p_value: float
    detectable_drop: float
    verdict: BaselineVerdict
    recorded_at: str
    commit: str | None
    machine: MachineFigures | None = None  # when the host loop could be weighed
    busy: BusyFigures | None = None  # when the CPU time per token could be weighed
    waits: WaitFigures | None = None  # when both sides measured the ranks' own waits


@dataclass(frozen=True)
class DetectableFigures:
    """What a baseline made of this run's samples would let the gate catch."""

    detectable_drop: float


@dataclass(frozen=True)
class RelativeSpeedFigures:
    baseline: float
    change: float
    tolerance: float
    p_value: float
    detectable_drop: float
    verdict: BaselineVerdict  # "machine busy" when the busy check excused it


@dataclass(frozen=True)
class WorkFigures:
    """What the work check found changed against the baseline's counts (work.compare_work)."""

    tolerance: float  # of bytes, ops, FLOPs and kernels; kinds and calls are exact
    more: tuple[str, ...]  # more work, a new collective kind or more calls: each fails
    less: tuple[str, ...]  # less work: a stale baseline


@dataclass(frozen=True)
class DeviceTimeFigures:
    """Kernel time per decode token against the recorded runs' (lower is better)."""

    baseline_s: float
    change: float  # of time: positive when slower
    tolerance: float
    p_value: float
    verdict: Verdict  # of the rate, 1 / time: "regression" when the time grew


Figures = (
    ThresholdFigures
    | BaselineFigures
    | DetectableFigures
    | RelativeSpeedFigures
    | WorkFigures
    | DeviceTimeFigures
)


@dataclass(frozen=True)
class Check:
    name: CheckName
    status: CheckStatus
    message: str
    figures: Figures | None = None  # for reports; None when the check had nothing to measure


@dataclass(frozen=True)
class GateSettings:
    efficiency: float
    tolerance: float | None  # None: derived from the baseline's own noise
    alpha: float = 0.01
    # Repeats within one run share the machine's state, so their spread misses drift between
    # runs; the tolerance derived from noise never goes below this floor. The runs that set it:
    # docs/gates.md (docs/benchmarks/cpu.md).
    tolerance_floor: float = 0.10
    # From RUNS_FOR_SETTLED_FLOOR recorded runs on, their medians' spread measures the drift the
    # floor above stands in for, so the floor drops to this (docs/gates.md).
    settled_tolerance_floor: float = 0.02
    # The speed relative to the bare model timed beside each sample does not move with the
    # host: a floor for what is left (pairing jitter, the strategy's own variance).
    relative_tolerance_floor: float = 0.05
    memory_tolerance: float = 0.10
    strict: bool = False  # a missing baseline fails
    fail_on_improvement: bool = False  # a stale (much faster) baseline fails
    gates: bool = True  # False: every check is reported, none fails the test (--distperf-gates)
    # The work gate's relative tolerance of bytes, ops, FLOPs and kernels (--distperf-work-
    # tolerance); collective kinds and calls are exact.
    work_tolerance: float = 0.01
    # Floors of the noise of the device time and of the CPU time per token: both barely move
    # with the host, so their floors sit below the throughput's (docs/gates.md).
    device_time_tolerance_floor: float = 0.02
    cpu_tolerance_floor: float = 0.10
    # The least rise of the ranks' own waits, as a share of the wall time, that fails a slower
    # run (judge/waits.py): an idle CPU rank's share moves by well under it (docs/gates.md).
    wait_share_floor: float = 0.05


def baseline_check(
    entry: BaselineEntry | None,
    samples: Sequence[float],
    settings: GateSettings,
    topology_key: str,
    known_keys: Sequence[str],
) -> Check:
    if entry is None:
        check = detectable_check(samples, settings)
        others = [k for k in known_keys if k != topology_key]
        where = f"no baseline for this test on this machine (topology key {topology_key})"
        if others:
            where += f"; baselines exist for: {', '.join(others)}"
        status = CheckStatus.FAIL if settings.strict else CheckStatus.NOTE
        hint = " (--distperf-strict makes this a failure)" if not settings.strict else ""
        return Check("baseline", status, f"{where}{hint}; {check.message}", check.figures)
    # From 3 recorded runs on, their median is the level: the latest refresh alone may have met
    # the host at an odd speed (docs/benchmarks/h200-2026-11-30-gate.md).
    settled = len(entry.run_medians) >= RUNS_FOR_SETTLED_FLOOR
    comparison = compare_to_recorded_runs(
        entry.samples,
        samples,
        entry.run_medians,
        tolerance=settings.tolerance,
        alpha=settings.alpha,
        tolerance_floor=settings.settled_tolerance_floor if settled else settings.tolerance_floor,
    )
    figures = BaselineFigures(
        baseline_tokens_per_sec=comparison.baseline_median,
        change=comparison.change,
        tolerance=comparison.tolerance,
        tolerance_runs=comparison.tolerance_runs,
        p_value=comparison.p_value,
        detectable_drop=comparison.detectable_drop,
        verdict=comparison.verdict,
        recorded_at=entry.recorded_at,
        commit=entry.commit,
    )
    return Check("baseline", comparison_status(comparison, settings), comparison.message(), figures)


def relative_speed_check(
    entry: BaselineEntry | None, samples: Sequence[float], settings: GateSettings
) -> Check:
    """The strategy's speed relative to the bare model run beside each sample, against the
    baseline's. The host's own speed cancels out of it, so it can be held to a tolerance the
    throughput of a drifting host cannot; a model that got slower by itself moves both runs
    alike and shows in the throughput check only."""
    name: CheckName = "relative_speed"
    if not samples:
        return Check(name, CheckStatus.NOTE, "no bare model was timed beside this run")
    if entry is None or not entry.relative_samples:
        return Check(name, CheckStatus.NOTE, "no baseline of the speed relative to the bare model")
    comparison = compare_to_recorded_runs(
        entry.relative_samples,
        samples,
        entry.relative_run_medians,
        tolerance=settings.tolerance,
        alpha=settings.alpha,
        tolerance_floor=settings.relative_tolerance_floor,
        unit="x bare",
        subject="relative speed",
    )
    figures = RelativeSpeedFigures(
        baseline=comparison.baseline_median,
        change=comparison.change,
        tolerance=comparison.tolerance,
        p_value=comparison.p_value,
        detectable_drop=comparison.detectable_drop,
        verdict=comparison.verdict,
    )
    message = (
        f"{comparison.message()} (relative speed: the generation time of the bare model, no "
        "wrapper and no collectives, run right after each repeat, over this run's; the host's "
        "own speed cancels out)"
    )
    return Check(name, comparison_status(comparison, settings), message, figures)


def detectable_check(samples: Sequence[float], settings: GateSettings) -> Check:
    """What a baseline made of these samples would let the gate catch."""
    if len(samples) < 2:
        return Check("baseline", CheckStatus.NOTE, "one sample: no drop is detectable")
    drop = detectable_drop(
        samples,
        len(samples),
        tolerance=settings.tolerance,
        alpha=settings.alpha,
        tolerance_floor=settings.tolerance_floor,
    )
    text = (
        "no drop is detectable with this noise and these repeats"
        if math.isinf(drop)
        else f"as a baseline these samples would catch drops of {drop:.1%} or more"
    )
    return Check("baseline", CheckStatus.NOTE, text, DetectableFigures(drop))


def memory_check(
    entry: BaselineEntry | None, peak_bytes: int, settings: GateSettings, exact: bool = True
) -> Check:
    """`exact`: the figure is an allocator peak (CUDA). A process RSS peak (CPU ranks) also
    counts the unsharded build and allocator caching, and moves between identical runs far more
    than an allocator peak does, so it only warns."""
    if entry is None or entry.peak_memory_bytes is None:
        return Check("memory", CheckStatus.NOTE, "no baseline peak memory")
    problem = compare_memory(entry.peak_memory_bytes, peak_bytes, settings.memory_tolerance)
    if problem:
        return Check("memory", CheckStatus.FAIL if exact else CheckStatus.WARN, problem)
    return Check("memory", CheckStatus.OK, "peak memory within tolerance")


def skipped_check(name: CheckName, why: str) -> Check:
    return Check(name, CheckStatus.SKIP, why)


def comparison_status(comparison: Comparison, settings: GateSettings) -> CheckStatus:
    """A stale (much faster) baseline warns unless --distperf-fail-on-improvement; a change
    beyond the tolerance without statistical support only warns."""
    return {
        "ok": CheckStatus.OK,
        "regression": CheckStatus.FAIL,
        "improvement": CheckStatus.FAIL if settings.fail_on_improvement else CheckStatus.WARN,
        "noisy": CheckStatus.WARN,
    }[comparison.verdict]


@dataclass(frozen=True)
class Decision:
    """Every check of one run, in the order a reader wants them."""

    threshold: Check
    baseline: Check
    relative_speed: Check
    memory: Check
    gates: bool = True  # False: reported only; the verdict says "off" and nothing fails the test
    work: Check = Check("work", CheckStatus.SKIP, "not run")  # judge/counted.py
    device_time: Check = Check("device_time", CheckStatus.SKIP, "not run")
    loss: Check = Check("loss", CheckStatus.SKIP, "not a training run")  # training only
    # What something outside the ranks took, against the baseline's (judge/busy.py); None
    # without a baseline to compare with.
    busy_evidence: BusyEvidence | None = None

    @property
    def checks(self) -> tuple[Check, ...]:
        return tuple(getattr(self, name) for name in CHECK_NAMES)

    @property
    def failed(self) -> bool:
        """A check failed with the gates on: the test fails, and the run is no baseline."""
        return self.gates and any(c.status is CheckStatus.FAIL for c in self.checks)

    @property
    def verdict(self) -> str:
        """One word for tables: the worst outcome of any check."""
        for status, word in ((CheckStatus.FAIL, "FAIL"), (CheckStatus.WARN, "WARN")):
            names = [c.name for c in self.checks if c.status is status]
            if names:
                verdict = f"{word} ({', '.join(names)})"
                return verdict if self.gates else f"off; {verdict}"
        return "ok" if self.gates else "off"

    def failure_text(self) -> str:
        """Why the test fails; "" when it passes, as it always does with the gates off."""
        if not self.gates:
            return ""
        return "\n\n".join(
            f"distperf {c.name} check failed:\n{c.message}"
            for c in self.checks
            if c.status is CheckStatus.FAIL
        )
