"""The timed checks against the recorded runs: the throughput ("baseline") and the speed
relative to the bare model, each by the tolerance rule (judge/tolerance.py); outside evidence
that explains a failure makes it a "machine busy" warning and a rise of the ranks' own waits
fails a slower run (judge/busy.py). Pure: no I/O, no pytest."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_distperf.judge import busy
from pytest_distperf.judge.checks import (
    BaselineFigures,
    BaselineVerdict,
    Check,
    CheckStatus,
    DetectableFigures,
    GateSettings,
    RelativeSpeedFigures,
    comparison_status,
)
from pytest_distperf.judge.stats import Comparison, at_level, compare, detectable_drop
from pytest_distperf.judge.tolerance import (
    GROSS_DROP,
    RELATIVE_FLOOR,
    RUNS_TO_SETTLE,
    THROUGHPUT_FLOOR,
    WAIT_SHARE_FLOOR,
    Tolerance,
    run_tolerance,
)
from pytest_distperf.measured import RunResult, off_cpu_shares
from pytest_distperf.store.entry import BaselineEntry


def outcome(
    comparison: Comparison, tolerance: Tolerance, settings: GateSettings, excuse: str
) -> tuple[CheckStatus, BaselineVerdict, str]:
    """A regression the busy evidence explains (`excuse`) warns; a provisional baseline's change
    is a note within this machine class's host drift and a warning beyond it."""
    status = comparison_status(comparison.verdict, settings)
    if status is CheckStatus.FAIL and comparison.verdict == "regression" and excuse:
        return CheckStatus.WARN, "machine busy", f"machine busy, not failed: {excuse}"
    if not tolerance.provisional or comparison.verdict != "ok":
        return status, comparison.verdict, ""  # the comparison's message says it all
    runs = f"{tolerance.runs} of {RUNS_TO_SETTLE} recorded runs"
    needs = f"record {tolerance.runs_needed} more with --distperf-update-baselines"
    if -comparison.change <= tolerance.drift:
        words = (
            f"provisional baseline ({runs}): only a drop beyond {GROSS_DROP:.0%} fails until "
            f"then; {needs}"
        )
        return CheckStatus.NOTE, "provisional", words
    words = (
        f"provisional baseline ({runs}): a drop beyond this machine class's host drift "
        f"({tolerance.drift:.0%}) but within the gross margin ({GROSS_DROP:.0%}); {needs} to "
        "judge it against the drift they show"
    )
    return CheckStatus.WARN, "provisional", words


def _against_runs(
    samples: Sequence[float],
    recorded: Sequence[float],
    history: Sequence[float],
    floor: float,
    result: RunResult,
    settings: GateSettings,
    **words: str,
) -> tuple[Tolerance, Comparison]:
    """The runs' tolerance, and the samples against the latest repeats at the runs' level."""
    accelerator = result.spec.accelerator
    tolerance = run_tolerance(history, floor, accelerator, settings.tolerance)
    comparison = compare(
        at_level(recorded, history),
        samples,
        tolerance=tolerance.fails,
        alpha=settings.alpha,
        level_runs=len(history) if len(history) >= RUNS_TO_SETTLE else 0,
        **words,
    )
    return tolerance, comparison


def baseline_check(
    entry: BaselineEntry | None,
    result: RunResult,
    settings: GateSettings,
    topology_key: str,
    known_keys: Sequence[str],
) -> Check:
    """The throughput against the recorded runs, and a slower run's own waits against theirs."""
    samples = result.tokens_per_sec_samples
    if entry is None:
        check = detectable_check(samples, settings)
        others = [k for k in known_keys if k != topology_key]
        where = f"no baseline for this test on this machine (topology key {topology_key})"
        if others:
            where += f"; baselines exist for: {', '.join(others)}"
        status = CheckStatus.FAIL if settings.strict else CheckStatus.NOTE
        hint = " (--distperf-strict makes this a failure)" if not settings.strict else ""
        return Check("baseline", status, f"{where}{hint}; {check.message}", check.figures)
    history = entry.run_medians or (entry.median,)
    floor = THROUGHPUT_FLOOR.get(result.spec.accelerator, THROUGHPUT_FLOOR["cpu"])
    tolerance, comparison = _against_runs(samples, entry.samples, history, floor, result, settings)
    evidence = busy.busy_evidence(entry, result)
    level, rate = comparison.baseline_median, comparison.current_median
    cpu = busy.cpu_change(entry, result, evidence.core_slowdown)
    explained, excuse = busy.weigh(level, rate, tolerance.fails, evidence, cpu)
    shares = off_cpu_shares([r.samples for r in result.ranks])
    waits = busy.wait_figures(entry, shares, evidence, rate, WAIT_SHARE_FLOOR)
    status, verdict, headline = outcome(comparison, tolerance, settings, excuse)
    lines = [line for line in (headline, comparison.message()) if line]
    rose = waits is not None and waits.rise - waits.outside_share > waits.tolerance
    if waits is not None and rose and comparison.change < 0:
        status, verdict = CheckStatus.FAIL, "regression"
        lines.insert(0, busy.waits_words(waits))
    elif status is CheckStatus.FAIL:
        lines.append(busy.unexplained(evidence, explained, cpu))
    figures = BaselineFigures(
        baseline_tokens_per_sec=level,
        change=comparison.change,
        tolerance=tolerance.fails,
        tolerance_runs=0 if tolerance.provisional or tolerance.explicit else tolerance.runs,
        p_value=comparison.p_value,
        detectable_drop=comparison.detectable_drop,
        verdict=verdict,
        recorded_at=entry.recorded_at,
        commit=entry.commit,
        runs_needed=tolerance.runs_needed,
        waits=waits,
    )
    return Check("baseline", status, "\n".join(lines), figures)


def relative_speed_check(
    entry: BaselineEntry | None, result: RunResult, settings: GateSettings
) -> Check:
    """The bare model's time over the wrapped one's by the throughput's rule: the host's speed
    moves both. A failure each generation's wait for a core explains is a busy machine."""
    samples = result.relative_speed_samples
    if not samples:
        return Check("relative_speed", CheckStatus.SKIP, "no bare model was timed beside this run")
    if entry is None or not entry.relative_samples:
        message = "no baseline of the speed relative to the bare model"
        return Check("relative_speed", CheckStatus.NOTE, message)
    recorded, floor = entry.relative_samples, RELATIVE_FLOOR
    history = entry.relative_run_medians or (statistics.median(recorded),)
    words = {"unit": "x bare", "subject": "relative speed"}
    tolerance, comparison = _against_runs(
        samples, recorded, history, floor, result, settings, **words
    )
    excuse = ""
    unqueued = result.relative_speed_unqueued_samples
    evidence = busy.busy_evidence(entry, result)
    waited = evidence.run_queue_wait_per_token_s
    cpu = busy.cpu_change(entry, result, evidence.core_slowdown)
    if waited and unqueued and (cpu is None or cpu <= tolerance.fails):
        change = statistics.median(unqueued) / comparison.baseline_median - 1.0
        if change >= -tolerance.fails:
            excuse = (
                f"run-queue wait +{waited * 1e3:.3g} ms per token beyond the baseline's; with "
                f"each generation's wait for a core taken out it changed {change:+.1%}"
            )
    status, verdict, headline = outcome(comparison, tolerance, settings, excuse)
    figures = RelativeSpeedFigures(
        baseline=comparison.baseline_median,
        change=comparison.change,
        tolerance=tolerance.fails,
        p_value=comparison.p_value,
        detectable_drop=comparison.detectable_drop,
        verdict=verdict,
    )
    lines = [headline] if headline else []
    lines.append(
        f"{comparison.message()} (the bare model, no wrapper and no collectives, timed beside "
        "each repeat: the host's own speed cancels out)"
    )
    return Check("relative_speed", status, "\n".join(lines), figures)


def detectable_check(samples: Sequence[float], settings: GateSettings) -> Check:
    """What a baseline of these samples would catch from its first recorded run."""
    if len(samples) < 2:
        return Check("baseline", CheckStatus.NOTE, "one sample: no drop is detectable")
    tolerance = GROSS_DROP if settings.tolerance is None else settings.tolerance
    drop = detectable_drop(samples, len(samples), tolerance, settings.alpha)
    text = (
        "no drop is detectable with this noise and these repeats"
        if math.isinf(drop)
        else f"as a baseline these samples would catch drops of {drop:.1%} or more"
    )
    return Check("baseline", CheckStatus.NOTE, text, DetectableFigures(drop))
