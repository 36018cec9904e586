"""What something outside a rank took from it beyond the baseline's level (run-queue wait,
steal, a slower core): a "machine busy" warning where it explains a timing failure. And the
ranks' own waits (a sleep, a sync, I/O, a lock, a peer), which no machine excuses. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pytest_distperf.judge.checks import BusyEvidence, WaitFigures
from pytest_distperf.judge.tolerance import RUNS_TO_SETTLE, SAFETY, recorded_level
from pytest_distperf.measured import RunResult
from pytest_distperf.store.entry import BaselineEntry


def busy_evidence(entry: BaselineEntry, result: RunResult) -> BusyEvidence:
    """Each measure's excess over the baseline's level; None where either side lacks it. A
    training step's collectives wait for cores on their own threads: never evidence."""

    def beyond(now: float | None, history: Sequence[float]) -> float | None:
        return None if now is None or not history else max(now - recorded_level(history), 0.0)

    loop_cpu = result.host_loop_cpu_samples
    core = None
    if entry.host_loop_run_medians and loop_cpu:
        # never below 1: it only takes a slower core out
        core = max(statistics.median(loop_cpu) / recorded_level(entry.host_loop_run_medians), 1.0)
    waited = None if result.training else waited_for_a_core(result)
    return BusyEvidence(
        beyond(waited, entry.run_queue_wait_run_medians),
        beyond(result.steal_per_token_s, entry.steal_run_medians),
        core,
    )


def waited_for_a_core(result: RunResult) -> float | None:
    """Per token, the ranks' threads' wait for a core, or where larger the slowest rank's timing
    thread's within each repeat (the process-wide figure spans the fences too)."""
    waited = result.run_queue_wait_per_token_s
    samples = result.samples
    if waited is None or not samples or any(s.queued_s is None for s in samples):
        return waited
    queued = sum(s.queued_s or 0.0 for s in samples) / (len(samples) * result.new_tokens)
    return max(waited, queued)


def cpu_change(entry: BaselineEntry, result: RunResult, core: float | None) -> float | None:
    """CPU time per token against the recorded runs', over the core's slowdown (None: unknown)."""
    history, now = entry.host_cpu_run_medians, result.host_cpu_per_token_s
    if not history or now is None:
        return None
    return now / recorded_level(history) / (core or 1.0) - 1.0


def weigh(
    level_rate: float,
    rate: float,
    tolerance: float,
    evidence: BusyEvidence,
    cpu: float | None = None,
) -> tuple[float, str]:
    """The share of the lost time per token the evidence explains, and the words naming each
    measure where the rate without them is back within `tolerance` ("" where it is not, or
    where the rank's own CPU time per token, `cpu`, rose beyond it)."""
    wall_s, level_s = 1.0 / rate, 1.0 / level_rate
    core = evidence.core_slowdown or 1.0
    ran_s = (wall_s - evidence.outside_s) / core
    lost_s = max(wall_s - level_s, 1e-12)
    beyond = level_s / ran_s - 1.0 if ran_s > 0 else 0.0
    explained = min(max((wall_s - ran_s) / lost_s, 0.0), 1.0)
    said = _evidence_words(evidence, lost_s, wall_s)
    if not said or beyond < -tolerance or (cpu is not None and cpu > tolerance):
        return explained, ""
    return explained, f"{said}; without them {beyond:+.1%} (tolerance {tolerance:.1%})"


def unexplained(evidence: BusyEvidence, explained: float, cpu: float | None) -> str:
    """What a failure says of the outside evidence that did not explain it."""
    said = _evidence_words(evidence, 1.0, 1.0, shares=False)
    outside = "nothing beyond the baseline's"
    if said:
        outside = f"{said}; together {explained:.0%} of the lost time"
    own = "" if cpu is None else f"; its own CPU time per token {cpu:+.1%} on that core"
    return f"measured outside the rank: {outside}{own}"


def _evidence_words(
    evidence: BusyEvidence, lost_s: float, wall_s: float, shares: bool = True
) -> str:
    """Each measure that took time, with its share of the lost time; "" where none did."""

    def share(seconds: float) -> str:
        return f", {seconds / lost_s:.0%} of the lost time" if shares else ""

    parts = []
    if evidence.run_queue_wait_per_token_s:
        wait = evidence.run_queue_wait_per_token_s
        parts.append(f"run-queue wait +{wait * 1e3:.3g} ms per token{share(wait)}")
    if evidence.steal_per_token_s:
        steal = evidence.steal_per_token_s
        parts.append(f"steal +{steal * 1e3:.3g} ms per token{share(steal)}")
    core = evidence.core_slowdown or 1.0
    if core > 1.0:
        slower_s = (wall_s - evidence.outside_s) * (1.0 - 1.0 / core)
        parts.append(f"a core {core - 1.0:.1%} slower (the fixed loop's CPU time){share(slower_s)}")
    return "; ".join(parts)


def wait_figures(
    entry: BaselineEntry,
    shares: Sequence[float],
    evidence: BusyEvidence,
    rate: float,
    floor: float,
) -> WaitFigures | None:
    """The ranks' own off-CPU share against RUNS_TO_SETTLE or more recorded runs' (None before);
    the tolerance is max(floor, SAFETY x their largest rise above their median), and the busy
    evidence's share of the wall time (at `rate` tokens a second) is taken off the rise."""
    history = entry.off_cpu_share_run_medians
    if len(history) < RUNS_TO_SETTLE or not shares:
        return None
    level, share = statistics.median(history), statistics.median(shares)
    return WaitFigures(
        off_cpu_share=share,
        baseline_off_cpu_share=level,
        rise=share - level,
        tolerance=max(floor, SAFETY * max(recorded - level for recorded in history)),
        outside_share=min(evidence.outside_s * rate, 1.0),
    )


def waits_words(figures: WaitFigures) -> str:
    outside = (
        f", {figures.outside_share:.1%} of it measured outside the ranks and taken off"
        if figures.outside_share
        else ""
    )
    return (
        f"the ranks waited {figures.off_cpu_share:.1%} of each repeat's wall time off the CPU by "
        f"their own doing, {figures.baseline_off_cpu_share:.1%} when recorded: "
        f"{figures.rise:+.1%}{outside} (tolerance {figures.tolerance:.1%}, from the recorded "
        "runs' spread). A wait the rank chose (a sleep, a host-device sync, I/O, a lock, a "
        "peer in a collective) is a regression no machine excuses"
    )
