"""When a slower run is the machine's fault, and only on evidence that it is: what something
outside a rank measurably took from it (its threads' run-queue wait, the host's steal, a slower
core), beyond what it took when the baseline was recorded. A wait the rank chose is never an
excuse, and flat CPU time per token is no evidence: it can only veto. Pure: no I/O, no pytest.
Mechanics: docs/gates.md, "Machine check" and "What can excuse a slower run".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from pytest_distperf.judge.checks import (
    MACHINE_BUSY,
    MACHINE_SLOWER,
    NO_EVIDENCE,
    BaselineFigures,
    BusyEvidence,
    BusyFigures,
    Check,
    CheckStatus,
    Figures,
    GateSettings,
    MachineFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
)
from pytest_distperf.judge.tolerance import drift_tolerance, recorded_level
from pytest_distperf.store.entry import BaselineEntry

RANK_OWN = (
    "the rest is the rank's own: its code computes more, or it waits (a sleep, a host-device "
    "sync, I/O, a lock, a peer in a collective), which no machine excuses"
)


def cpu_change(
    entry: BaselineEntry | None, host_cpu_s: float | None, settings: GateSettings
) -> tuple[float, float] | None:
    """(change, tolerance) of the CPU time per token against the recorded runs', or None
    where either side has none."""
    history: Sequence[float] = () if entry is None else entry.host_cpu_run_medians
    if host_cpu_s is None or not history:
        return None
    tolerance = max(settings.cpu_tolerance_floor, drift_tolerance(history, settings.alpha))
    return host_cpu_s / recorded_level(history) - 1.0, tolerance


def core_slowdown(entry: BaselineEntry | None, loop_cpu_samples: Sequence[float]) -> float:
    """The fixed loop's CPU time now over its time when recorded (on the idle machine a baseline
    is recorded on, its wall time): 1 where unknown and never below 1, so it only takes a slower
    core out."""
    if entry is None or not entry.host_loop_run_medians or not loop_cpu_samples:
        return 1.0
    then = recorded_level(entry.host_loop_run_medians)
    return max(statistics.median(loop_cpu_samples) / then, 1.0)


def busy_evidence(
    entry: BaselineEntry | None,
    waited_per_token_s: float | None,
    stolen_per_token_s: float | None,
    loop_cpu_samples: Sequence[float],
) -> BusyEvidence:
    """Each measure's excess over the baseline's recorded level; None where this run or the
    baseline lacks it (a baseline recorded before the measure existed excuses nothing)."""

    def beyond(now: float | None, history: Sequence[float]) -> float | None:
        return None if now is None or not history else max(now - recorded_level(history), 0.0)

    if entry is None:
        return NO_EVIDENCE
    known_core = bool(entry.host_loop_run_medians and loop_cpu_samples)
    return BusyEvidence(
        beyond(waited_per_token_s, entry.run_queue_wait_run_medians),
        beyond(stolen_per_token_s, entry.steal_run_medians),
        core_slowdown(entry, loop_cpu_samples) if known_core else None,
    )


def machine_check(
    baseline: Check,
    relative: Check,
    entry: BaselineEntry | None,
    host_loop_samples: Sequence[float],
    host_paced: bool = True,
) -> Check:
    """`baseline`, a "machine slower" warning where the fixed interpreter loop's loss of speed
    (hostspeed.py), the most a slower host can take off a run of host work, accounts for its
    regression down to the tolerance and the relative speed kept pace (docs/gates.md, "Machine
    check"). A run partly bound by the device is excused a little more than its host share
    warrants; one replayed as CUDA graphs (`host_paced` False) is paced by the device: never."""
    figures, relative_figures = baseline.figures, relative.figures
    if (
        not host_paced
        or not isinstance(figures, BaselineFigures)
        or figures.verdict != "regression"
        or relative.status is CheckStatus.FAIL
        or not isinstance(relative_figures, RelativeSpeedFigures)
        or entry is None
        or not host_loop_samples
        # The loop's level must come from the runs the throughput's level comes from; a history
        # recorded partly before the loop existed (or broken by a run without it) does not.
        or len(entry.host_loop_run_medians) != len(entry.run_medians)
    ):
        return baseline
    change, relative_change, tolerance = figures.change, relative_figures.change, figures.tolerance
    host_then = recorded_level(entry.host_loop_run_medians)  # as the throughput's level
    host_now = statistics.median(host_loop_samples)
    host_change = host_then / host_now - 1  # of speed: negative when the loop took longer
    beyond_host = (1 + change) / (1 + host_change) - 1
    machine = MachineFigures(
        bare_change=(1 + change) / (1 + relative_change) - 1,
        host_change=host_change,
        change_beyond_host=beyond_host,
    )
    explained = host_change < 0 and beyond_host >= -tolerance and relative_change >= -tolerance
    if not explained:
        return replace(baseline, figures=replace(figures, machine=machine))
    message = (
        f"{baseline.message}; not failed: the machine itself ran slower. The host's own speed (a "
        f"fixed interpreter loop, no model code) was {-host_change:.1%} lower than when recorded "
        f"({host_now * 1e3:.3g} ms against {host_then * 1e3:.3g} ms); with that taken out the "
        f"change is {beyond_host:+.1%}, within the tolerance, and the speed relative to the bare "
        f"model timed beside each repeat changed by {relative_change:+.1%}. Code that got slower "
        "by itself would not have slowed that loop."
    )
    excused = replace(figures, machine=machine, verdict=MACHINE_SLOWER)
    return Check(baseline.name, CheckStatus.WARN, message, excused)


def busy_check(
    baseline: Check,
    relative: Check,
    work: Check,
    device_time: Check,
    cpu: tuple[float, float] | None,
    evidence: BusyEvidence,
    unqueued_relative: Sequence[float] = (),
) -> tuple[Check, Check]:
    """`baseline` and `relative`, each turned into a "machine busy" warning where it regressed,
    the counted work and (where measured) the device time per token did not move, the CPU time
    per token did not rise beyond its noise, and the evidence explains the loss down to within
    the tolerance. A regression it does not explain keeps its failure, and says how much of the
    loss the evidence did account for."""
    core = evidence.core_slowdown or 1.0
    cpu_rose = cpu is not None and (1.0 + cpu[0]) / core - 1.0 > cpu[1]
    steady = (
        work.status is CheckStatus.OK
        and device_time.status in (CheckStatus.OK, CheckStatus.SKIP)
        and not cpu_rose
    )
    figures = baseline.figures
    relative = _busy_relative(relative, unqueued_relative, evidence, steady)
    if not (_regressed(baseline) and isinstance(figures, BaselineFigures)):
        return baseline, relative
    wall_s = 1.0 / (figures.baseline_tokens_per_sec * (1.0 + figures.change))
    baseline_s = 1.0 / figures.baseline_tokens_per_sec
    ran_s = (wall_s - evidence.outside_s) / core
    beyond = ran_s / baseline_s - 1.0
    lost_s = wall_s - baseline_s
    busy = BusyFigures(
        wall_s / baseline_s - 1.0,
        None if cpu is None else cpu[0],
        None if cpu is None else cpu[1],
        evidence,
        min(max((wall_s - ran_s) / lost_s, 0.0), 1.0),
        beyond,
    )
    said = _evidence_words(evidence, lost_s, wall_s)
    if steady and said and beyond <= figures.tolerance:
        excuse = (
            f"wall time per token {busy.wall_change:+.1%}; measured outside the rank: {said}; "
            f"without them {beyond:+.1%} (tolerance {figures.tolerance:.1%}), "
            f"{_steady_words(device_time, cpu, core)}"
        )
        excused = replace(figures, busy=busy, verdict=MACHINE_BUSY)
        return _excused(baseline, excuse, excused), relative
    why = f"{said}: {busy.explained_share:.0%} of the lost time" if said else "nothing"
    if cpu_rose and cpu is not None:
        why += f", while its CPU time per token rose {(1.0 + cpu[0]) / core - 1.0:+.1%}"
    message = f"{baseline.message}\nnot a busy machine: measured outside the rank, {why}; "
    kept = replace(baseline, message=message + RANK_OWN, figures=replace(figures, busy=busy))
    return kept, relative


def _excused(check: Check, excuse: str, figures: Figures) -> Check:
    """`check` as a "machine busy" warning: the excuse first, then what the check found."""
    message = f"machine busy: {excuse}, so something outside this rank took its time. Not failed"
    return Check(check.name, CheckStatus.WARN, f"{message}: {check.message}", figures)


def _busy_relative(
    relative: Check, unqueued: Sequence[float], evidence: BusyEvidence, steady: bool
) -> Check:
    """The relative speed, excused where this run waited for a core beyond the baseline's and,
    with each generation's wait for a core taken out of its time (the wrapped and the bare
    one's, each measured on its own timing thread), it is within its tolerance."""
    figures = relative.figures
    waited = evidence.run_queue_wait_per_token_s
    if (
        not steady
        or not _regressed(relative)
        or not isinstance(figures, RelativeSpeedFigures)
        or not waited
        or not unqueued
    ):
        return relative
    change = statistics.median(unqueued) / figures.baseline - 1.0
    if change < -figures.tolerance:
        return relative
    excuse = (
        f"this run waited {waited * 1e3:.3g} ms per token for a core beyond the baseline's (run "
        "queue); with each generation's wait for a core taken out of its time, the relative "
        f"speed changed {change:+.1%} (tolerance {figures.tolerance:.1%})"
    )
    return _excused(relative, excuse, replace(figures, verdict=MACHINE_BUSY))


def busy_threshold(threshold: Check, work: Check, unqueued_tokens_per_sec: float | None) -> Check:
    """A failed threshold turned into a "machine busy" warning where the rate the run had with
    each repeat's wait for a core taken out (measured on the ranks' timing threads) meets the
    threshold and the counted work did not grow."""
    figures = threshold.figures
    if (
        threshold.status is not CheckStatus.FAIL
        or not unqueued_tokens_per_sec
        or work.status is CheckStatus.FAIL
        or not isinstance(figures, ThresholdFigures)
        or unqueued_tokens_per_sec < figures.threshold_tokens_per_sec
    ):
        return threshold
    excuse = (
        "without the ranks' wait for a core (run queue, measured on their timing threads) it ran "
        f"at {unqueued_tokens_per_sec:.4g} tok/s, above the threshold "
        f"{figures.threshold_tokens_per_sec:.4g} tok/s"
    )
    return _excused(threshold, excuse, figures)


def _regressed(check: Check) -> bool:
    verdict = getattr(check.figures, "verdict", None)
    return check.status is CheckStatus.FAIL and verdict == "regression"


def _evidence_words(evidence: BusyEvidence, lost_s: float, wall_s: float) -> str:
    """Each measure that took time, with its share of the lost time; "" where none did."""
    parts = []
    if evidence.run_queue_wait_per_token_s:
        wait = evidence.run_queue_wait_per_token_s
        parts.append(
            f"waited {wait * 1e3:.3g} ms per token for a core beyond the baseline's (run queue, "
            f"{wait / lost_s:.0%} of the lost time)"
        )
    if evidence.steal_per_token_s:
        steal = evidence.steal_per_token_s
        parts.append(
            f"the hypervisor took {steal * 1e3:.3g} ms per token beyond the baseline's (steal, "
            f"{steal / lost_s:.0%})"
        )
    core = evidence.core_slowdown or 1.0
    if core > 1.0:
        slower_s = (wall_s - evidence.outside_s) * (1.0 - 1.0 / core)
        parts.append(
            f"its core ran {core - 1.0:.1%} slower (the fixed loop's CPU time, "
            f"{slower_s / lost_s:.0%})"
        )
    return "; ".join(parts)


def _steady_words(device_time: Check, cpu: tuple[float, float] | None, core: float) -> str:
    device = " and device time per token" if device_time.status is CheckStatus.OK else ""
    words = f"the counted work{device} did not change"
    if cpu is not None:
        words += f" and the CPU time per token {(1.0 + cpu[0]) / core - 1.0:+.1%} on that core"
    return words
