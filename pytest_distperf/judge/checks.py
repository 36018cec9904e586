"""What a check returns (pytest-benchmark's `fails()` idea, with a status so that a passing run
carries its figures too), each check's typed figures, the settings and the `Decision`. Pure."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal, get_args

from pytest_distperf.judge.stats import Verdict
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
#: A comparison's verdict, or the throughput check's own words for an excused or early one.
BaselineVerdict = Literal[Verdict, "machine busy", "provisional"]


@dataclass(frozen=True)
class ThresholdFigures:
    predicted_tokens_per_sec: float
    threshold_tokens_per_sec: float
    efficiency: float
    bound: str
    bound_description: str
    link_class: str
    ratio_to_predicted: float


@dataclass(frozen=True)
class BusyEvidence:
    """What something outside the rank took from it per new token beyond the baseline's level
    (judge/busy.py); None where not measured."""

    run_queue_wait_per_token_s: float | None  # its threads runnable, waiting for a core
    steal_per_token_s: float | None  # the hypervisor ran another guest (per CPU)
    core_slowdown: float | None  # the fixed loop's CPU time over the baseline's, >= 1

    @property
    def outside_s(self) -> float:
        """Time per token taken outright: the wait for a core and the steal."""
        return (self.run_queue_wait_per_token_s or 0.0) + (self.steal_per_token_s or 0.0)


@dataclass(frozen=True)
class WaitFigures:
    """The ranks' own waits (judge/busy.py): shares of the wall time of a repeat."""

    off_cpu_share: float  # the rank that waited most, median of the repeats
    baseline_off_cpu_share: float  # the recorded runs' level
    rise: float  # off_cpu_share - baseline_off_cpu_share
    tolerance: float  # from the recorded runs' spread of that share
    outside_share: float  # what the busy evidence took (run queue, steal), taken off the rise


@dataclass(frozen=True)
class BaselineFigures:
    baseline_tokens_per_sec: float
    change: float
    tolerance: float
    tolerance_runs: int  # recorded runs the tolerance came from
    p_value: float
    detectable_drop: float
    verdict: BaselineVerdict
    recorded_at: str
    commit: str | None
    runs_needed: int = 0  # recorded runs still missing before the tolerance is the runs' own
    waits: WaitFigures | None = None  # where both sides measured the ranks' own waits


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
    verdict: BaselineVerdict


@dataclass(frozen=True)
class DeviceTimeFigures:
    baseline_s: float
    change: float  # of time: positive when slower
    tolerance: float
    verdict: Verdict  # "regression" when the time grew


Figures = (
    ThresholdFigures
    | BaselineFigures
    | DetectableFigures
    | RelativeSpeedFigures
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
    tolerance: float | None  # None: the rule on the recorded runs (judge/tolerance.py)
    alpha: float = 0.01
    strict: bool = False  # a missing baseline fails
    fail_on_improvement: bool = False  # a stale (much faster) baseline fails
    gates: bool = True  # False: every check is reported, none fails the test (--distperf-gates)
    work_tolerance: float = 0.01  # bytes, ops, FLOPs and kernels; kinds and calls are exact


# Peak memory's allowed growth (docs/gates.md).
MEMORY_TOLERANCE = 0.10


def memory_check(entry: BaselineEntry | None, peak_bytes: int | None, exact: bool) -> Check:
    """Peak memory against the baseline's. `exact`: an allocator peak (CUDA); a process RSS peak
    (CPU ranks) moves between identical runs far more, so it only warns."""
    stored = None if entry is None else entry.peak_memory_bytes
    if stored is None:
        return Check("memory", CheckStatus.NOTE, "no baseline peak memory")
    tolerance, now = MEMORY_TOLERANCE, peak_bytes or 0
    growth = now / stored - 1.0 if stored else math.inf if now else 0.0
    if growth <= tolerance:
        return Check("memory", CheckStatus.OK, "peak memory within tolerance")
    growth_text = "from nothing" if math.isinf(growth) else f"by {growth:.1%}"
    problem = (
        f"peak memory grew {growth_text} (tolerance {tolerance:.1%}): measured "
        f"{format_bytes(now)} vs baseline {format_bytes(stored)}"
    )
    return Check("memory", CheckStatus.FAIL if exact else CheckStatus.WARN, problem)


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{value:.3g} TiB"


def skipped_check(name: CheckName, why: str) -> Check:
    return Check(name, CheckStatus.SKIP, why)


def comparison_status(verdict: str, settings: GateSettings) -> CheckStatus:
    """A verdict's status: a stale baseline warns unless --distperf-fail-on-improvement."""
    return {
        "ok": CheckStatus.OK,
        "regression": CheckStatus.FAIL,
        "improvement": CheckStatus.FAIL if settings.fail_on_improvement else CheckStatus.WARN,
        "noisy": CheckStatus.WARN,
    }[verdict]


@dataclass(frozen=True)
class Decision:
    """Every check of one run, in the order a reader wants them."""

    threshold: Check
    baseline: Check
    relative_speed: Check
    memory: Check
    gates: bool = True  # False: reported only; the verdict says "off" and nothing fails the test
    work: Check = Check("work", CheckStatus.SKIP, "not run")
    device_time: Check = Check("device_time", CheckStatus.SKIP, "not run")
    loss: Check = Check("loss", CheckStatus.SKIP, "not a training run")
    busy_evidence: BusyEvidence | None = None  # None without a baseline to compare with

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
