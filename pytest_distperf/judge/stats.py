"""A timed figure against its baseline (pure functions, no I/O): a change fails only beyond the
tolerance (tolerance.py, from the recorded runs) and where a one-sided test at ``alpha`` says
the repeats moved (significance.py: one unlucky repeat must not fail CI).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pytest_distperf.jsonfields import is_count
from pytest_distperf.judge.significance import METHOD_NAMES, Method, choose_method, one_sided_p
from pytest_distperf.judge.tolerance import check_fraction, detectable_drop, recorded_level
from pytest_distperf.store.spread import checked_rates

Verdict = Literal["ok", "regression", "improvement", "noisy"]


@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing measured samples with a baseline's (rates: higher is better)."""

    baseline_median: float
    current_median: float
    change: float  # current / baseline - 1: negative when slower
    tolerance: float  # the change allowed either way
    p_value: float  # one-sided, in the direction of the change; NaN where no test can run
    detectable_drop: float  # the smallest drop this comparison flags; inf when none
    verdict: Verdict
    n_baseline: int
    n_current: int
    alpha: float
    method: Method
    unit: str = "tok/s"
    subject: str = "throughput"  # what was compared, for the message's headline
    level_runs: int = 0  # recorded runs whose median set the level (0: the latest run's)

    def message(self) -> str:
        headline = {
            "ok": "within tolerance",
            "regression": "regression",
            "improvement": "improved beyond tolerance; the baseline looks stale, update it",
            "noisy": "changed beyond tolerance without statistical support; rerun with more "
            "repeats",
        }[self.verdict]
        level = f", the median of {self.level_runs} recorded runs" if self.level_runs else ""
        test = (
            f"no test reaches alpha={self.alpha:g} with {self.n_baseline} vs {self.n_current} "
            "samples"
            if self.method == "none"
            else f"p={self.p_value:.3g} ({METHOD_NAMES[self.method]}, one-sided)"
        )
        detect = (
            "no drop is detectable"
            if math.isinf(self.detectable_drop)
            else f"smallest detectable drop {self.detectable_drop:.1%}"
        )
        return (
            f"{self.subject} {headline}: measured median {self.current_median:.5g} {self.unit} "
            f"(n={self.n_current}) vs baseline {self.baseline_median:.5g} {self.unit} "
            f"(n={self.n_baseline}{level}); change {self.change:+.1%} (tolerance "
            f"{self.tolerance:.1%}); {test}; {detect}"
        )


def compare(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    tolerance: float,
    alpha: float = 0.01,
    unit: str = "tok/s",
    subject: str = "throughput",
    level_runs: int = 0,
) -> Comparison:
    """Whether ``current`` samples moved from ``baseline``'s (already at the recorded level):
    "regression" (slower beyond ``tolerance`` and significant), "improvement" (faster beyond
    it and significant: the baseline is stale), "noisy" (beyond it, not significant) or "ok"."""
    base = checked_rates(baseline, "baseline")
    cur = checked_rates(current, "current")
    check_fraction(alpha, "alpha", upper=1.0, allow_zero=False)
    check_fraction(tolerance, "tolerance", upper=math.inf)
    base_median = statistics.median(base)
    cur_median = statistics.median(cur)
    change = cur_median / base_median - 1.0
    method = choose_method(len(base), len(cur), alpha)
    p_value = one_sided_p(base, cur, method, slower=change <= 0)
    significant = not math.isnan(p_value) and p_value <= alpha
    verdict: Verdict
    if abs(change) <= tolerance:
        verdict = "ok"
    elif not significant:
        verdict = "noisy"
    else:
        verdict = "regression" if change < 0 else "improvement"
    return Comparison(
        baseline_median=base_median,
        current_median=cur_median,
        change=change,
        tolerance=tolerance,
        p_value=p_value,
        detectable_drop=detectable_drop(base, len(cur), tolerance, alpha),
        verdict=verdict,
        n_baseline=len(base),
        n_current=len(cur),
        alpha=alpha,
        method=method,
        unit=unit,
        subject=subject,
        level_runs=level_runs,
    )


def at_level(samples: Sequence[float], run_medians: Sequence[float]) -> list[float]:
    """The latest recorded repeats rescaled to the recorded runs' level (recorded_level): their
    shape serves the significance test, the runs' median the level."""
    base = checked_rates(samples, "baseline")
    scale = recorded_level(run_medians) / statistics.median(base) if run_medians else 1.0
    return [v * scale for v in base]


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
