"""Noise-aware regression decisions on repeated throughput samples (pure functions, no I/O).

A run regressed only when its median fell by more than the tolerance (tolerance.py: whole runs
drift, which repeats cannot see) AND a one-sided test at ``alpha`` says its samples are slower
(significance.py: a few unlucky repeats must not fail CI). Why both: docs/gates.md, "Baselines".
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_distperf.jsonfields import is_count
from pytest_distperf.judge.significance import (
    METHOD_NAMES,
    Method,
    choose_method,
    mann_whitney_floor,
    one_sided_p,
)
from pytest_distperf.judge.tolerance import (
    MIN_RUNS_FOR_DRIFT,
    check_fraction,
    checked_rates,
    default_tolerance,
    detectable_drop,
    drift_tolerance,
)

Verdict = Literal["ok", "regression", "improvement", "noisy"]


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing measured throughput samples with a baseline's."""

    baseline_median: float
    current_median: float
    #: Relative change of the medians: current / baseline - 1 (negative = slower).
    change: float
    #: Relative change of the median that is tolerated in either direction.
    tolerance: float
    #: One-sided p-value in the direction of the observed change (slower if change <= 0,
    #: faster otherwise); NaN when no test can be run on these sample counts.
    p_value: float
    #: Smallest relative drop that this comparison would flag as a regression (both conditions),
    #: assuming the run has the baseline's noise; inf when none can be flagged.
    detectable_drop: float
    verdict: Verdict
    n_baseline: int
    n_current: int
    alpha: float
    method: Method
    unit: str = "tok/s"
    #: What was compared, for the message's headline.
    subject: str = "throughput"
    #: Number of recorded runs whose spread set the tolerance (0: it came from the repeats).
    tolerance_runs: int = 0
    #: Number of recorded runs whose median set the baseline's level (0: the latest run's).
    level_runs: int = 0

    @property
    def significant(self) -> bool:
        return not math.isnan(self.p_value) and self.p_value <= self.alpha

    def message(self) -> str:
        headline = (
            self.subject
            + {
                "ok": " within tolerance",
                "regression": " regression",
                "improvement": " improved beyond tolerance; the baseline looks stale, update it",
                "noisy": " changed beyond tolerance but without statistical support; "
                "rerun with more repeats",
            }[self.verdict]
        )
        parts = [
            f"{headline}: measured median {self.current_median:.5g} {self.unit} "
            f"(n={self.n_current}) vs baseline median {self.baseline_median:.5g} {self.unit} "
            f"(n={self.n_baseline}"
            + (f", the median of {self.level_runs} recorded runs" if self.level_runs else "")
            + f"); change {self.change:+.1%} (tolerance {self.tolerance:.1%}"
            + (
                f", from the spread of {self.tolerance_runs} recorded runs"
                if self.tolerance_runs
                else ""
            )
            + ")",
        ]
        if self.method == "none":
            parts.append(
                f"no test can reach alpha={self.alpha:g} with {self.n_baseline} vs "
                f"{self.n_current} samples; record more repeats"
            )
        else:
            side = "slower" if self.change <= 0 else "faster"
            parts.append(
                f"p={self.p_value:.3g} ({METHOD_NAMES[self.method]}, one-sided {side}, "
                f"alpha={self.alpha:g})"
            )
            floor = mann_whitney_floor(self.n_baseline, self.n_current)
            if self.method != "mann-whitney":
                parts.append(
                    f"too few repeats for Mann-Whitney U: its smallest p with "
                    f"{self.n_baseline} vs {self.n_current} samples is {floor:.3g} > alpha, so "
                    f"the test assumes log-normal rates"
                )
        if math.isinf(self.detectable_drop):
            parts.append("no drop is detectable with this baseline noise and these repeats")
        else:
            parts.append(f"smallest detectable drop {self.detectable_drop:.1%}")
        return "; ".join(parts)


def compare(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    tolerance: float | None = None,
    alpha: float = 0.01,
    tolerance_floor: float = 0.05,
    unit: str = "tok/s",
    run_medians: Sequence[float] = (),
    subject: str = "throughput",
) -> Comparison:
    """Decide whether ``current`` throughput samples regressed against ``baseline`` samples.

    ``tolerance`` is relative (0.1 = 10%); None derives it from the baseline's noise and from
    ``run_medians`` (the medians of the runs recorded for this test) with
    :func:`default_tolerance`. Verdicts: "regression" (slower beyond tolerance and significant),
    "improvement" (faster beyond tolerance and significant: the baseline is stale), "noisy"
    (beyond tolerance either way but not significant, or untestable), "ok" otherwise.
    """
    base = checked_rates(baseline, "baseline")
    cur = checked_rates(current, "current")
    runs = checked_rates(run_medians, "run_medians") if run_medians else []
    check_fraction(alpha, "alpha", upper=1.0, allow_zero=False)
    tol = default_tolerance(base, tolerance_floor, runs, alpha) if tolerance is None else tolerance
    check_fraction(tol, "tolerance", upper=math.inf)
    drift = drift_tolerance(runs, alpha)
    tolerance_runs = len(runs) if tolerance is None and drift > 0 and drift == tol else 0

    base_median = statistics.median(base)
    cur_median = statistics.median(cur)
    change = cur_median / base_median - 1.0
    method = choose_method(len(base), len(cur), alpha)
    p_value = one_sided_p(base, cur, method, slower=change <= 0)
    significant = not math.isnan(p_value) and p_value <= alpha

    verdict: Verdict
    if abs(change) <= tol:
        verdict = "ok"
    elif not significant:
        verdict = "noisy"
    else:
        verdict = "regression" if change < 0 else "improvement"

    return Comparison(
        baseline_median=base_median,
        current_median=cur_median,
        change=change,
        tolerance=tol,
        p_value=p_value,
        detectable_drop=detectable_drop(base, len(cur), tolerance=tol, alpha=alpha),
        verdict=verdict,
        n_baseline=len(base),
        n_current=len(cur),
        alpha=alpha,
        method=method,
        unit=unit,
        subject=subject,
        tolerance_runs=tolerance_runs,
    )


def compare_to_recorded_runs(
    baseline: Sequence[float],
    current: Sequence[float],
    run_medians: Sequence[float],
    *,
    tolerance: float | None = None,
    alpha: float = 0.01,
    tolerance_floor: float = 0.05,
    unit: str = "tok/s",
    subject: str = "throughput",
) -> Comparison:
    """:func:`compare` for a quantity whose whole runs agree better than their repeats do (the
    relative speed: docs/benchmarks/h200-2026-11-30.md). From MIN_RUNS_FOR_DRIFT recorded runs
    on, their median is the level (the latest repeats, rescaled to it, keep their shape for the
    test) and the default tolerance max(floor, their drift tolerance); the repeats' own spread
    no longer enters. With fewer runs this is :func:`compare`.
    """
    runs = checked_rates(run_medians, "run_medians") if run_medians else []
    if len(runs) < MIN_RUNS_FOR_DRIFT:
        return compare(
            baseline,
            current,
            tolerance=tolerance,
            alpha=alpha,
            tolerance_floor=tolerance_floor,
            unit=unit,
            run_medians=runs,
            subject=subject,
        )
    check_fraction(tolerance_floor, "tolerance_floor", upper=math.inf)
    base = checked_rates(baseline, "baseline")
    scale = statistics.median(runs) / statistics.median(base)
    derived = max(tolerance_floor, drift_tolerance(runs, alpha))
    comparison = compare(
        [v * scale for v in base],
        current,
        tolerance=derived if tolerance is None else tolerance,
        alpha=alpha,
        unit=unit,
        subject=subject,
    )
    from_runs = len(runs) if tolerance is None and derived > tolerance_floor else 0
    return dataclasses.replace(comparison, tolerance_runs=from_runs, level_runs=len(runs))


def compare_memory(
    baseline_bytes: int | None, current_bytes: int | None, tolerance: float = 0.10
) -> str | None:
    """Failure message when peak memory grew by more than ``tolerance`` (relative), else None,
    as where either side was not measured (a CPU run without an allocator hook)."""
    check_fraction(tolerance, "tolerance", upper=math.inf)
    if baseline_bytes is None or current_bytes is None:
        return None
    for name, value in (("baseline_bytes", baseline_bytes), ("current_bytes", current_bytes)):
        if not is_count(value):
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if baseline_bytes == 0:
        growth = math.inf if current_bytes > 0 else 0.0
    else:
        growth = current_bytes / baseline_bytes - 1.0
    if growth <= tolerance:
        return None
    growth_text = "from nothing" if math.isinf(growth) else f"by {growth:.1%}"
    return (
        f"peak memory grew {growth_text} (tolerance {tolerance:.1%}): measured "
        f"{format_bytes(current_bytes)} vs baseline {format_bytes(baseline_bytes)}"
    )


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.3g} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{value:.3g} TiB"
