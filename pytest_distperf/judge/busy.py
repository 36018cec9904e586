"""When a slower run is the machine's fault: another process took the ranks' cores.

Two signs, each read only where the counted work did not change. A rank's CPU time per token
rises when its own code does more and stays put when a neighbour takes its core. And on Linux
the kernel counts the time a rank's threads waited runnable for a core (the run-queue delay):
a rank waiting for its peer or its device sleeps, which is not counted, so that wait is what a
neighbour took. A neighbour on a shared core (or its SMT sibling) also makes the
rank's own CPU time run slower: the fixed interpreter loop beside each repeat, timed in CPU
time, measures that, and the CPU times are divided by it. A throughput regression whose wall
time, less that wait, stays within the baseline's tolerance, or a threshold miss whose rate
without that wait meets the threshold, becomes a "machine busy" warning. Pure: no I/O, no
pytest. Mechanics: docs/gates.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from pytest_distperf.judge.checks import (
    MACHINE_BUSY,
    BaselineFigures,
    BusyFigures,
    Check,
    CheckStatus,
    GateSettings,
    RelativeSpeedFigures,
    ThresholdFigures,
)
from pytest_distperf.judge.tolerance import MIN_RUNS_FOR_DRIFT, drift_tolerance
from pytest_distperf.store.entry import BaselineEntry

NOT_FAILED = "so another process took this rank's cores. Not failed"
# The share of the lost time a rank's wait for a core must explain to excuse the rest.
MOSTLY = 0.5


def cpu_change(
    entry: BaselineEntry | None, host_cpu_s: float | None, settings: GateSettings
) -> tuple[float, float] | None:
    """(change, tolerance) of the CPU time per token against the recorded runs', or None
    where either side has none. The level is set as the throughput's: the runs' median from
    MIN_RUNS_FOR_DRIFT on, the latest run before that."""
    history: Sequence[float] = () if entry is None else entry.host_cpu_run_medians
    if host_cpu_s is None or not history:
        return None
    level = statistics.median(history) if len(history) >= MIN_RUNS_FOR_DRIFT else history[-1]
    tolerance = max(settings.cpu_tolerance_floor, drift_tolerance(history, settings.alpha))
    return host_cpu_s / level - 1.0, tolerance


def core_slowdown(entry: BaselineEntry | None, loop_cpu_samples: Sequence[float]) -> float:
    """How much slower this run's cores ran than the baseline's, when they ran: the fixed loop's
    CPU time now over its time when recorded (on the idle machine a baseline is recorded on,
    its wall time is its CPU time); 1 where unknown, and never below 1, so that it only ever
    takes a slower core out."""
    if entry is None or not entry.host_loop_run_medians or not loop_cpu_samples:
        return 1.0
    levels = entry.host_loop_run_medians
    then = statistics.median(levels) if len(levels) >= MIN_RUNS_FOR_DRIFT else levels[-1]
    return max(statistics.median(loop_cpu_samples) / then, 1.0)


def busy_check(
    baseline: Check,
    relative: Check,
    work: Check,
    device_time: Check,
    cpu: tuple[float, float] | None,
    waited_per_token_s: float | None = None,
    core: float = 1.0,
) -> tuple[Check, Check]:
    """`baseline` and `relative`, each turned into a "machine busy" warning where it regressed
    but the counted work and (where measured) the device time per token did not move, and
    either the CPU time per token did not move or the wait for a core explains the loss. The
    wall time per token is the throughput's for the baseline check, the wrapped model's
    against the bare model's beside it for the relative speed check (whose bare runs wait
    alike, so only the CPU time speaks there). `core`: core_slowdown's factor, taken out of the
    CPU time and of the time the rank ran."""
    if cpu is not None and core > 1.0:
        cpu = ((1.0 + cpu[0]) / core - 1.0, cpu[1])
    steady = work.status is CheckStatus.OK and device_time.status in (
        CheckStatus.OK,
        CheckStatus.SKIP,
    )
    device = " and device time per token" if device_time.status is CheckStatus.OK else ""
    figures = baseline.figures
    if _regressed(baseline) and isinstance(figures, BaselineFigures):
        wall = 1.0 / (1.0 + figures.change) - 1.0  # wall time per token: positive when slower
        busy = None
        excuse = None
        if cpu is not None:
            busy = BusyFigures(wall, host_cpu_change=cpu[0], host_cpu_tolerance=cpu[1])
            excuse = _cpu_excuse("wall time per token", wall, cpu, device) if steady else None
        if excuse is None and steady and waited_per_token_s:
            kept_pace = relative.status is not CheckStatus.FAIL
            excuse = _wait_excuse(figures, waited_per_token_s, core, device, kept_pace)
        if excuse is not None:
            excused = replace(figures, busy=busy, verdict=MACHINE_BUSY)
            baseline = Check(
                baseline.name, CheckStatus.WARN, f"{excuse}: {baseline.message}", excused
            )
        elif busy is not None:
            baseline = replace(baseline, figures=replace(figures, busy=busy))
    relative_figures = relative.figures
    if (
        cpu is not None
        and steady
        and _regressed(relative)
        and isinstance(relative_figures, RelativeSpeedFigures)
    ):
        wall = 1.0 / (1.0 + relative_figures.change) - 1.0
        excuse = _cpu_excuse("wall time per token against the bare model's", wall, cpu, device)
        if excuse is not None:
            excused_relative = replace(relative_figures, verdict=MACHINE_BUSY)
            message = f"{excuse}: {relative.message}"
            relative = Check(relative.name, CheckStatus.WARN, message, excused_relative)
    return baseline, relative


def busy_threshold(threshold: Check, work: Check, waited_per_token_s: float | None) -> Check:
    """A failed threshold turned into a "machine busy" warning where the rate the run would
    have had without its wait for a core meets the threshold and the counted work did not
    grow."""
    figures = threshold.figures
    if (
        threshold.status is not CheckStatus.FAIL
        or not waited_per_token_s
        or work.status is CheckStatus.FAIL
        or not isinstance(figures, ThresholdFigures)
    ):
        return threshold
    measured = figures.ratio_to_predicted * figures.predicted_tokens_per_sec
    ran_per_token = 1.0 / measured - waited_per_token_s
    if ran_per_token <= 0 or 1.0 / ran_per_token < figures.threshold_tokens_per_sec:
        return threshold
    excuse = (
        f"machine busy: this rank waited {waited_per_token_s * 1e3:.3g} ms per token for a "
        f"core (run queue); without that wait it ran at {1.0 / ran_per_token:.4g} tok/s, above "
        f"the threshold {figures.threshold_tokens_per_sec:.4g} tok/s, {NOT_FAILED}"
    )
    return Check(threshold.name, CheckStatus.WARN, f"{excuse}: {threshold.message}", figures)


def _regressed(check: Check) -> bool:
    verdict = getattr(check.figures, "verdict", None)
    return check.status is CheckStatus.FAIL and verdict == "regression"


def _cpu_excuse(what: str, wall: float, cpu: tuple[float, float], device: str) -> str | None:
    """The warning's words, or None where the CPU time per token explains the slow-down."""
    change, tolerance = cpu
    # The CPU's own rise must stay within its noise and explain under half the wall time's.
    if change > tolerance or change > wall / 2:
        return None
    return (
        f"machine busy: {what} {wall:+.1%} while CPU time per token {change:+.1%} (its noise "
        f"{tolerance:.1%}); the counted work{device} did not change, {NOT_FAILED}"
    )


def _wait_excuse(
    figures: BaselineFigures, waited_s: float, core: float, device: str, kept_pace: bool
) -> str | None:
    """The warning's words, or None where the wall time less the wait for a core (at the
    baseline's core speed) is still slower than the baseline's tolerance allows, unless the
    wait is most of the loss and the strategy kept pace with the bare model beside it: a core
    shared with a neighbour also makes the rank's own time longer (caches, switches), beyond
    what the wait shows (docs/benchmarks/cpu-2026-12-02-work.md)."""
    wall_s = 1.0 / (figures.baseline_tokens_per_sec * (1.0 + figures.change))
    baseline_s = 1.0 / figures.baseline_tokens_per_sec
    ran_change = (wall_s - waited_s) / core / baseline_s - 1.0
    mostly_waited = kept_pace and waited_s >= MOSTLY * (wall_s - baseline_s)
    if ran_change > figures.tolerance and not mostly_waited:
        return None
    slower_core = f" and its core ran {core - 1.0:.1%} slower (the fixed loop)" if core > 1 else ""
    return (
        f"machine busy: wall time per token {wall_s / baseline_s - 1.0:+.1%}; this rank waited "
        f"{waited_s * 1e3:.3g} ms per token for a core (run queue){slower_core}; without that "
        f"{ran_change:+.1%} (tolerance {figures.tolerance:.1%}), and the counted "
        f"work{device} did not change, {NOT_FAILED}"
    )
