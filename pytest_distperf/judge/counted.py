"""Checks on what the counted generation saw: the work gate (counts do not move between
unchanged runs: calls and collective kinds exact, the rest within a small tolerance), the
device time per token, and the reason a slower run gets (its work changed, or the same work got
slower). Pure: no I/O, no pytest. Mechanics: docs/gates.md, "The work gate".
"""

from __future__ import annotations

from dataclasses import replace

from pytest_distperf.judge.checks import (
    Check,
    CheckStatus,
    DeviceTimeFigures,
    GateSettings,
    WorkFigures,
    comparison_status,
    skipped_check,
)
from pytest_distperf.judge.stats import compare_to_recorded_runs
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.work import Work, compare_work, work_cell


def work_check(
    entry: BaselineEntry | None, work: Work | None, settings: GateSettings, counted: bool = True
) -> Check:
    """The counted work against the baseline's: more work, a new collective kind or a changed
    call count fails; less work warns that the baseline is stale."""
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
    figures = WorkFigures(
        tolerance=tolerance,
        more=tuple(c.message for c in comparison.more),
        less=tuple(c.message for c in comparison.less),
    )
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
        return Check("work", CheckStatus.FAIL, message, figures)
    if comparison.less:
        status = CheckStatus.FAIL if settings.fail_on_improvement else CheckStatus.WARN
        message = (
            f"less work than the baseline counted; the baseline looks stale, update it: "
            f"{comparison.message()} {rule}"
        )
        return Check("work", status, message, figures)
    message = f"the same work as the baseline: collectives per token {work_cell(work)} {rule}"
    return Check("work", CheckStatus.OK, message, figures)


def device_time_check(
    entry: BaselineEntry | None, device_time_s: float | None, settings: GateSettings
) -> Check:
    """Kernel time per decode token against the recorded runs', with the throughput's
    statistics (judge/stats.py) on its inverse, device tokens per second: lower is better."""
    if device_time_s is None:
        return skipped_check("device_time", "no device time per token (CPU ranks, or not counted)")
    history = () if entry is None else entry.device_time_run_medians
    if not history:
        return Check("device_time", CheckStatus.NOTE, "no baseline of the device time per token")
    rates = [1.0 / t for t in history]
    comparison = compare_to_recorded_runs(
        rates,
        [1.0 / device_time_s],
        rates,
        tolerance=settings.tolerance,
        alpha=settings.alpha,
        tolerance_floor=settings.device_time_tolerance_floor,
        unit="tok/device-s",
        subject="device time per token",
    )
    baseline_s = 1.0 / comparison.baseline_median
    change = device_time_s / baseline_s - 1.0  # of time: positive when slower
    figures = DeviceTimeFigures(
        baseline_s=baseline_s,
        change=change,
        tolerance=comparison.tolerance,
        p_value=comparison.p_value,
        verdict=comparison.verdict,
    )
    headline = {
        "ok": "device time per token within tolerance",
        "regression": "device time per token grew",
        "improvement": "device time per token fell beyond tolerance; the baseline looks stale, "
        "update it",
        "noisy": "device time per token changed beyond tolerance without statistical support",
    }[comparison.verdict]
    runs = f", the median of {len(history)} recorded runs" if len(history) > 1 else ""
    message = (
        f"{headline}: {device_time_s * 1e3:.4g} ms vs baseline {baseline_s * 1e3:.4g} ms"
        f"{runs}; change {change:+.1%} (tolerance {comparison.tolerance:.1%}); summed kernel "
        "time per decode token of the counted generation"
    )
    return Check("device_time", comparison_status(comparison, settings), message, figures)


def with_work_reason(check: Check, work: Check, cpu: tuple[float, float] | None) -> Check:
    """A failed throughput check's message, with whether the counted work changed (and what)
    or the same work got slower; unchanged where the work was not compared."""
    if check.status is not CheckStatus.FAIL:
        return check
    figures = work.figures
    if not isinstance(figures, WorkFigures) or work.status in (CheckStatus.NOTE, CheckStatus.SKIP):
        return check
    if figures.more:
        reason = f"the counted work changed: {'; '.join(figures.more)}"
    elif figures.less:
        reason = f"the counted work shrank ({'; '.join(figures.less)}), yet the run got slower"
    else:
        reason = "the counted work is the baseline's: the same work got slower"
        if cpu is not None:
            reason += f" (CPU time per token {cpu[0]:+.1%})"
    return replace(check, message=f"{check.message}\n{reason}")
