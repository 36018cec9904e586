"""Checks on what the counted generation saw, both from the first recorded run: the work
(counts do not move between unchanged runs) and the device time per token. Pure."""

from __future__ import annotations

import statistics

from pytest_distperf.judge.checks import (
    Check,
    CheckStatus,
    DeviceTimeFigures,
    GateSettings,
    comparison_status,
    skipped_check,
)
from pytest_distperf.judge.stats import Verdict
from pytest_distperf.judge.tolerance import DEVICE_TIME_FLOOR, RUNS_TO_SETTLE, SAFETY, largest_drop
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.work import Work, compare_work, work_cell


def work_check(
    entry: BaselineEntry | None, work: Work | None, settings: GateSettings, counted: bool = True
) -> Check:
    """More work, a new collective kind or a changed call count fails; less warns (stale)."""
    if not counted:
        return skipped_check("work", "not counted (--distperf-count off)")
    if work is None:
        return Check("work", CheckStatus.NOTE, "the ranks counted no work for this run")
    if entry is None or entry.work is None:
        return Check(
            "work",
            CheckStatus.NOTE,
            f"no baseline of the counted work; collectives per token: {work_cell(work)}",
        )
    tolerance = settings.work_tolerance
    comparison = compare_work(entry.work, work, tolerance)
    rule = (
        f"(collective kinds and calls exact; bytes, ops, FLOPs and kernels within "
        f"{tolerance:.1%}; host syncs exact)"
    )
    if work.main.syncs is None:  # CPU ranks: no device for the host to wait on
        rule += "; host syncs not counted here (no device): the ranks' waits stand in for them"
    if comparison.notes:
        rule += "; " + "; ".join(comparison.notes)
    if comparison.more:
        message = f"the counted work changed: {comparison.message()} {rule}"
        return Check("work", CheckStatus.FAIL, message)
    if comparison.less:
        status = CheckStatus.FAIL if settings.fail_on_improvement else CheckStatus.WARN
        message = (
            f"less work than the baseline counted; the baseline looks stale, update it: "
            f"{comparison.message()} {rule}"
        )
        return Check("work", status, message)
    message = f"the same work as the baseline: collectives per token {work_cell(work)} {rule}"
    return Check("work", CheckStatus.OK, message)


def device_time_check(
    entry: BaselineEntry | None, device_time_s: float | None, settings: GateSettings
) -> Check:
    """Kernel time per decode token against the recorded runs' median: max(floor, SAFETY x the
    largest rise of any recorded run) once RUNS_TO_SETTLE are recorded, the floor before."""
    if device_time_s is None:
        return skipped_check("device_time", "no device time per token (CPU ranks, or not counted)")
    history = () if entry is None else entry.device_time_run_medians
    if not history:
        return Check("device_time", CheckStatus.NOTE, "no baseline of the device time per token")
    rates = [1.0 / t for t in history]  # a drop of rate is a rise of time
    tolerance = settings.tolerance
    if tolerance is None:
        spread = SAFETY * largest_drop(rates) if len(rates) >= RUNS_TO_SETTLE else 0.0
        tolerance = max(DEVICE_TIME_FLOOR, spread)
    baseline_s = statistics.median(history)
    change = device_time_s / baseline_s - 1.0  # of time: positive when slower
    verdict: Verdict = "ok"
    if abs(change) > tolerance:
        verdict = "regression" if change > 0 else "improvement"
    status = comparison_status(verdict, settings)
    headline = {
        "ok": "device time per token within tolerance",
        "regression": "device time per token grew",
        "improvement": "device time per token fell beyond tolerance; the baseline looks stale, "
        "update it",
    }[verdict]
    runs = f", the median of {len(history)} recorded runs" if len(history) > 1 else ""
    message = (
        f"{headline}: {device_time_s * 1e3:.4g} ms vs baseline {baseline_s * 1e3:.4g} ms"
        f"{runs}; change {change:+.1%} (tolerance {tolerance:.1%}); summed kernel time per "
        "decode token of the counted generation"
    )
    figures = DeviceTimeFigures(baseline_s, change, tolerance, verdict)
    return Check("device_time", status, message, figures)
