"""Decisions on one run: below the topology-aware threshold, regressed against the baseline,
stale baseline, memory growth, or fine; each with the message a user acts on.

Small check functions that return a `Check` (pytest-benchmark's `fails()` idea, with a status
instead of None so that passing runs carry their figures too). Pure: no I/O, no pytest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_distperf.judge.stats import (
    MIN_RUNS_FOR_DRIFT,
    Comparison,
    compare_memory,
    compare_to_recorded_runs,
    detectable_drop,
)
from pytest_distperf.perfmodel import Prediction, failure_message, threshold
from pytest_distperf.store.baseline import BaselineEntry

PASS, FAIL, WARN, NOTE = "pass", "fail", "warn", "note"


@dataclass(frozen=True)
class Check:
    name: str  # "threshold", "baseline", "relative_speed" or "memory"
    status: str  # PASS, FAIL, WARN (reported, not failing) or NOTE (nothing to judge)
    message: str
    fields: dict[str, Any] = field(default_factory=dict)  # figures for reports


@dataclass(frozen=True)
class GateSettings:
    efficiency: float
    tolerance: float | None  # None: derived from the baseline's own noise
    alpha: float = 0.01
    # Repeats within one run share the machine's state, so their spread misses drift between
    # runs: identical runs of the example suite on the 2-core CI VM moved by up to 8.1%
    # (docs/benchmarks/cpu.md). The tolerance derived from noise never goes below this.
    tolerance_floor: float = 0.10
    # The speed relative to the bare model timed beside each sample does not move with the
    # host: a floor for what is left (pairing jitter, the strategy's own variance).
    relative_tolerance_floor: float = 0.05
    memory_tolerance: float = 0.10
    strict: bool = False  # a missing baseline fails
    fail_on_improvement: bool = False  # a stale (much faster) baseline fails


def threshold_check(prediction: Prediction | None, measured: float, efficiency: float) -> Check:
    if prediction is None:
        return Check("threshold", NOTE, "no prediction for this run (see the report header)")
    floor = threshold(prediction, efficiency)
    fields = {
        "predicted_tokens_per_sec": prediction.tokens_per_sec,
        "threshold_tokens_per_sec": floor,
        "efficiency": efficiency,
        "bound": prediction.bound,
        "bound_description": prediction.bound_description,
        "link_class": prediction.link_class,
        "ratio_to_predicted": measured / prediction.tokens_per_sec,
    }
    if measured < floor:
        return Check("threshold", FAIL, failure_message(prediction, measured, efficiency), fields)
    message = (
        f"{measured:.4g} tok/s >= {efficiency:.0%} of predicted {prediction.tokens_per_sec:.4g} "
        f"tok/s (bound: {prediction.bound_description})"
    )
    return Check("threshold", PASS, message, fields)


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
        status = FAIL if settings.strict else NOTE
        hint = " (--distperf-strict makes this a failure)" if not settings.strict else ""
        return Check("baseline", status, f"{where}{hint}; {check.message}", check.fields)
    # From 3 recorded runs on, their median is the level: the latest refresh alone may have met
    # the host at an odd speed (on a 2 x H200 VM one did, and later runs read up to +67%).
    comparison = compare_to_recorded_runs(
        entry.samples,
        samples,
        entry.run_medians,
        tolerance=settings.tolerance,
        alpha=settings.alpha,
        tolerance_floor=settings.tolerance_floor,
    )
    fields = _comparison_fields(comparison, entry)
    status = _comparison_status(comparison, settings)
    return Check("baseline", status, comparison.message(), fields)


def relative_speed_check(
    entry: BaselineEntry | None, samples: Sequence[float], settings: GateSettings
) -> Check:
    """The strategy's speed relative to the bare model run beside each sample, against the
    baseline's. The host's own speed cancels out of it, so it can be held to a tolerance the
    throughput of a drifting host cannot; a model that got slower by itself moves both runs
    alike and shows in the throughput check only."""
    name = "relative_speed"
    if not samples:
        return Check(name, NOTE, "no bare model was timed beside this run")
    if entry is None or not entry.relative_samples:
        return Check(name, NOTE, "no baseline of the speed relative to the bare model")
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
    fields = {
        "relative_speed_baseline": comparison.baseline_median,
        "relative_speed_change": comparison.change,
        "relative_speed_tolerance": comparison.tolerance,
        "relative_speed_p_value": comparison.p_value,
        "relative_speed_detectable_drop": comparison.detectable_drop,
        "relative_speed_verdict": comparison.verdict,
    }
    status = _comparison_status(comparison, settings)
    message = (
        f"{comparison.message()} (relative speed: the generation time of the bare model, no "
        "wrapper and no collectives, run right after each repeat, over this run's; the host's "
        "own speed cancels out)"
    )
    return Check(name, status, message, fields)


def machine_check(
    baseline: Check,
    relative: Check,
    entry: BaselineEntry | None,
    host_loop_samples: Sequence[float],
) -> Check:
    """`baseline`, turned into a warning when the machine's own slowdown accounts for its
    regression.

    A fixed interpreter loop (hostspeed.py), which runs no model code, is timed beside each
    repeat and recorded with the baseline. Its loss of speed is the most a slower host can take
    off a run whose time is all host work: on a 2 x H200 VM, eager decode time moved with the
    loop's at 0.65-0.98 of its (log) range and a per-sample slope of 0.4-0.8
    (docs/benchmarks/data/noise-v3/), never more. That much is taken out of the throughput
    change; when what is left is within the tolerance, and the speed relative to the bare model
    beside each repeat neither failed nor fell by more than that tolerance (the strategy kept
    pace), the run warns "machine slower" with its figures instead of failing. Whatever the loop
    does not account for still fails: code that got slower by itself does not slow that loop. A
    run partly bound by the device is excused a little more than its host share warrants, the
    price of not knowing that share.
    """
    change = baseline.fields.get("change")
    relative_change = relative.fields.get("relative_speed_change")
    if (
        baseline.fields.get("baseline_verdict") != "regression"
        or relative.status == FAIL
        or relative_change is None
        or change is None
        or entry is None
        or not host_loop_samples
        # The loop's level must come from the runs the throughput's level comes from; a history
        # recorded partly before the loop existed (or broken by a run without it) does not.
        or len(entry.host_loop_run_medians) != len(entry.run_medians)
    ):
        return baseline
    tolerance = baseline.fields["tolerance"]
    levels = entry.host_loop_run_medians
    # As compare_to_recorded_runs sets the throughput's level: the runs' median from
    # MIN_RUNS_FOR_DRIFT on, the latest run before that.
    host_then = statistics.median(levels) if len(levels) >= MIN_RUNS_FOR_DRIFT else levels[-1]
    host_now = statistics.median(host_loop_samples)
    host_change = host_then / host_now - 1  # of speed: negative when the loop took longer
    beyond_host = (1 + change) / (1 + host_change) - 1
    fields = {
        "bare_change": (1 + change) / (1 + relative_change) - 1,
        "host_change": host_change,
        "change_beyond_host": beyond_host,
    }
    explained = host_change < 0 and beyond_host >= -tolerance and relative_change >= -tolerance
    if not explained:
        return replace(baseline, fields={**baseline.fields, **fields})
    message = (
        f"{baseline.message}; not failed: the machine itself ran slower. The host's own speed (a "
        f"fixed interpreter loop, no model code) was {-host_change:.1%} lower than when recorded "
        f"({host_now * 1e3:.3g} ms against {host_then * 1e3:.3g} ms); with that taken out the "
        f"change is {beyond_host:+.1%}, within the tolerance, and the speed relative to the bare "
        f"model timed beside each repeat changed by {relative_change:+.1%}. Code that got slower "
        "by itself would not have slowed that loop."
    )
    fields["baseline_verdict"] = "machine slower"
    return Check(baseline.name, WARN, message, {**baseline.fields, **fields})


def detectable_check(samples: Sequence[float], settings: GateSettings) -> Check:
    """What a baseline made of these samples would let the gate catch."""
    if len(samples) < 2:
        return Check("baseline", NOTE, "one sample: no drop is detectable", {})
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
    return Check("baseline", NOTE, text, {"detectable_drop": drop})


def memory_check(
    entry: BaselineEntry | None, peak_bytes: int, settings: GateSettings, exact: bool = True
) -> Check:
    """`exact`: the figure is an allocator peak (CUDA). A process RSS peak (CPU ranks) also
    counts the unsharded build and allocator caching and moves by ~10% between identical runs,
    so it only warns."""
    if entry is None or entry.peak_memory_bytes is None:
        return Check("memory", NOTE, "no baseline peak memory")
    problem = compare_memory(entry.peak_memory_bytes, peak_bytes, settings.memory_tolerance)
    if problem:
        return Check("memory", FAIL if exact else WARN, problem)
    return Check("memory", PASS, "peak memory within tolerance")


def _comparison_status(comparison: Comparison, settings: GateSettings) -> str:
    """A stale (much faster) baseline warns unless --distperf-fail-on-improvement; a change
    beyond the tolerance without statistical support only warns."""
    return {
        "ok": PASS,
        "regression": FAIL,
        "improvement": FAIL if settings.fail_on_improvement else WARN,
        "noisy": WARN,
    }[comparison.verdict]


def _comparison_fields(comparison: Comparison, entry: BaselineEntry) -> dict[str, Any]:
    return {
        "baseline_tokens_per_sec": comparison.baseline_median,
        "change": comparison.change,
        "tolerance": comparison.tolerance,
        "tolerance_runs": comparison.tolerance_runs,
        "p_value": comparison.p_value,
        "detectable_drop": comparison.detectable_drop,
        "baseline_verdict": comparison.verdict,
        "baseline_recorded_at": entry.recorded_at,
        "baseline_commit": entry.commit,
    }


@dataclass(frozen=True)
class Decision:
    checks: tuple[Check, ...]

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)

    @property
    def verdict(self) -> str:
        """One word for tables: the worst outcome of any check."""
        for status, word in ((FAIL, "FAIL"), (WARN, "WARN")):
            names = [c.name for c in self.checks if c.status == status]
            if names:
                return f"{word} ({', '.join(names)})"
        return "ok"

    def failure_text(self) -> str:
        return "\n\n".join(
            f"distperf {c.name} check failed:\n{c.message}" for c in self.checks if c.status == FAIL
        )

    def fields(self) -> dict[str, Any]:
        merged: dict[str, Any] = {"verdict": self.verdict}
        for check in self.checks:
            merged.update(check.fields)
            merged[f"{check.name}_status"] = check.status
            merged[f"{check.name}_message"] = check.message
        return merged
