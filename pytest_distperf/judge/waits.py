"""A rank that waits has regressed: the share of each generation's wall time its timing thread
spent neither on a core nor runnable (a wait it chose), against the baseline's. The host's
speed moves time on a core, not what a rank waits for; the busy evidence (run queue, steal) is
taken off the rise first, nothing else. Pure: no I/O, no pytest. Mechanics: docs/gates.md,
"What can excuse a slower run".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from pytest_distperf.judge.checks import (
    BaselineFigures,
    BusyEvidence,
    Check,
    CheckStatus,
    GateSettings,
    WaitFigures,
)
from pytest_distperf.judge.tolerance import (
    IQR_TO_SIGMA,
    MIN_RUNS_FOR_DRIFT,
    MIN_RUNS_FOR_QUARTILES,
    TOLERANCE_SIGMAS,
    drift_sigmas,
    recorded_level,
)
from pytest_distperf.store.entry import BaselineEntry


def wait_tolerance(
    history: Sequence[float], shares: Sequence[float], settings: GateSettings
) -> float:
    """How far the share may rise by itself: the largest of the floor, the recorded repeats'
    spread and the recorded runs' drift. The baseline's noise, never this run's: a regression
    must not widen its own tolerance."""
    within = 0.0
    if len(shares) >= MIN_RUNS_FOR_QUARTILES:
        quartiles = statistics.quantiles(shares, n=4)
        within = TOLERANCE_SIGMAS * (quartiles[2] - quartiles[0]) / IQR_TO_SIGMA
    drift = 0.0
    if len(history) >= MIN_RUNS_FOR_DRIFT:
        drift = statistics.stdev(history) * drift_sigmas(len(history), settings.alpha)
    return max(settings.wait_share_floor, within, drift)


def waits_check(
    baseline: Check,
    entry: BaselineEntry | None,
    shares: Sequence[float],
    evidence: BusyEvidence,
    settings: GateSettings,
) -> Check:
    """`baseline`, failed where the ranks' own waits grew beyond their tolerance whatever the
    throughput's verdict (a faster host hides a wait from it, not from this); with the waits'
    figures attached wherever both sides have them."""
    figures = baseline.figures
    history = () if entry is None else entry.off_cpu_share_run_medians
    if entry is None or not history or not isinstance(figures, BaselineFigures) or not shares:
        return baseline
    level = recorded_level(history)
    share = statistics.median(shares)
    wall_s = 1.0 / (figures.baseline_tokens_per_sec * (1.0 + figures.change))
    outside = min(evidence.outside_s / wall_s, 1.0)
    waits = WaitFigures(
        off_cpu_share=share,
        baseline_off_cpu_share=level,
        rise=share - level,
        tolerance=wait_tolerance(history, entry.off_cpu_share_samples, settings),
        outside_share=outside,
    )
    attached = replace(figures, waits=waits)
    own_rise = waits.rise - outside
    if own_rise <= waits.tolerance:
        return replace(baseline, figures=attached)
    said_outside = (
        f", {outside:.1%} of it measured outside the ranks (run queue, steal) and taken off"
        if outside
        else ""
    )
    message = (
        f"the ranks waited {share:.1%} of each generation's wall time off the CPU by their own "
        f"doing, {level:.1%} when recorded: {waits.rise:+.1%} of the wall time{said_outside} "
        f"(tolerance {waits.tolerance:.1%}) while tok/s changed {figures.change:+.1%}. Time "
        "neither on a core nor waiting for one is a wait the rank chose (a sleep, a host-device "
        "sync, I/O, a lock, a peer in a collective): a regression, which no machine excuses"
    )
    failed = replace(attached, verdict="regression")
    return Check(baseline.name, CheckStatus.FAIL, f"{message}\n{baseline.message}", failed)
