"""The ranks' own waits: the share of each repeat's wall time a rank's timing thread spent
neither on a core nor runnable (a sleep, a sync, I/O, a lock, a peer), against the recorded
runs' share and its spread. Read inside the throughput check: a slower run whose own waits rose
beyond that spread fails it, whatever its tolerance let pass. Pure: no I/O, no pytest.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pytest_distperf.judge.checks import BusyEvidence, WaitFigures
from pytest_distperf.judge.tolerance import RUNS_TO_SETTLE, SAFETY
from pytest_distperf.store.entry import BaselineEntry


def wait_tolerance(history: Sequence[float], floor: float) -> float:
    """max(floor, SAFETY x the largest rise of any recorded run's share above their median)."""
    level = statistics.median(history)
    return max(floor, SAFETY * max(share - level for share in history))


def wait_figures(
    entry: BaselineEntry,
    shares: Sequence[float],
    evidence: BusyEvidence,
    rate: float,
    floor: float,
) -> WaitFigures | None:
    """The waits' figures where both sides measured them and RUNS_TO_SETTLE recorded runs give
    their spread; the busy evidence's share of the wall time (at `rate` tokens a second) is
    taken off the rise."""
    history = entry.off_cpu_share_run_medians
    if len(history) < RUNS_TO_SETTLE or not shares:
        return None
    level, share = statistics.median(history), statistics.median(shares)
    return WaitFigures(
        off_cpu_share=share,
        baseline_off_cpu_share=level,
        rise=share - level,
        tolerance=wait_tolerance(history, floor),
        outside_share=min(evidence.outside_s * rate, 1.0),
    )


def waits_rose(figures: WaitFigures | None) -> bool:
    return figures is not None and figures.rise - figures.outside_share > figures.tolerance


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
