"""The threshold, one of two named checks: where ranks time themselves (CPU ranks, one CUDA
device) the re-timing check; where they cannot (several GPUs) the modelled one, the rate the
links and the calibration predict (perfmodel/), which `distperf predict` shows too.

Where ranks time themselves no collective crosses a link that a model could charge, so the
floor is the run's own step timed again just after its repeats, the same way, with the knobs
off (ranks/retime.py).
Where the bare model ran beside each repeat it ran beside each re-timing too, and the two are
also compared as speeds relative to it: this host's speed drifts between seconds, the pair
alike; a run fails only where both comparisons say its repeats ran slow.
Its job is to catch a run slowed or disturbed while it was timed; a slower strategy or model is
the baseline's and the work gate's to catch. With several GPUs the modelled prediction judges.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from pytest_distperf.judge.checks import RETIMING, Check, CheckStatus, ThresholdFigures
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import Prediction, failure_message, threshold
from pytest_distperf.spec import ranks_time_themselves

RETIMED_BOUND = "retimed"
RETIMED_WORDS = "the same step timed again just after the repeats"


@dataclass(frozen=True)
class Retimed:
    """The repeats against the re-timed step, two ways: as timed (`plain`, the repeats' rate
    over the re-timed rate) and each against the bare model beside it (`beside_bare`, the
    repeats' speed relative to it over the re-timing's; None where either had none)."""

    rate: float  # the re-timed rate, tokens/sec
    plain: float
    beside_bare: float | None
    during: float | None = None  # the repeats' median speed relative to the bare model
    after: float | None = None  # the re-timing's

    @property
    def ratio(self) -> float:
        """What the check judges: a run fails only where both views say its repeats ran slow
        (the host's drift moves the plain one, a short bare model's noise the other)."""
        return max(self.plain, self.beside_bare or 0.0)

    def words(self, measured: float) -> str:
        said = (
            f"the timed repeats ran at {self.plain:.0%} of the same step timed again just "
            f"after them ({measured:.4g} vs {self.rate:.4g} tok/s)"
        )
        if self.beside_bare is None:
            return said
        return (
            f"{said}, and at {self.beside_bare:.0%} of it against the bare model beside each "
            f"({self.during:.3g} x bare in the repeats, {self.after:.3g} x bare re-timed)"
        )


def retimed(result: RunResult) -> Retimed | None:
    """The repeats against the step re-timed after them; None where the ranks did not re-time."""
    rate = result.retimed_tokens_per_sec
    if not rate:
        return None
    plain = result.tokens_per_sec / rate
    during, after = result.relative_speed_samples, result.retimed_relative_speed_samples
    if not during or not after:
        return Retimed(rate, plain, None)
    during_s, after_s = statistics.median(during), statistics.median(after)
    return Retimed(rate, plain, during_s / after_s, during_s, after_s)


def threshold_check_of(
    result: RunResult, prediction: Prediction | None, efficiency: float, why_none: str = ""
) -> Check:
    """The run's threshold: the re-timing check where its ranks time themselves (a note where
    they did not re-time: never the modelled rate in its place), else the modelled one."""
    link_class = prediction.link_class if prediction else ""
    check = retiming_check(result, efficiency, link_class)
    if check is not None:
        return check
    if ranks_time_themselves(result.spec.accelerator, result.devices):
        return not_retimed(result)
    return threshold_check(prediction, result.tokens_per_sec, efficiency, why_none)


def retiming_check(result: RunResult, efficiency: float, link_class: str = "") -> Check | None:
    """The timed repeats against the re-timed step; None where the ranks did not re-time it
    (several GPUs, or re-timing off): the modelled prediction judges there."""
    seen = retimed(result)
    if seen is None:
        return None
    measured = result.tokens_per_sec
    judged_rate = measured / seen.ratio
    figures = ThresholdFigures(
        predicted_tokens_per_sec=judged_rate,
        threshold_tokens_per_sec=efficiency * judged_rate,
        efficiency=efficiency,
        bound=RETIMED_BOUND,
        bound_description=RETIMED_WORDS,
        link_class=link_class,
        ratio_to_predicted=seen.ratio,
        check=RETIMING,
    )
    said = seen.words(measured)
    if seen.ratio >= efficiency:
        message = f"re-timing check: {said}; it fails below {efficiency:.0%}"
        return Check("threshold", CheckStatus.OK, message, figures)
    what = "step" if result.training else "generation"
    both = "both " if seen.beside_bare is not None else ""
    message = (
        f"{result.strategy} on {result.devices} device(s), re-timing check: {said}, {both}below "
        f"{efficiency:.0%}.\n    The same wrapped {what} ran faster when timed again the same "
        "way with the knobs off (slowdown, comm_delay): the repeats were slowed while they were "
        "timed, by the timed loop itself or by the host then (a busy neighbour is excused only "
        "by its measured wait for a core: docs/gates.md)."
    )
    return Check("threshold", CheckStatus.FAIL, message, figures)


def not_retimed(result: RunResult) -> Check:
    """Where ranks time themselves but did not re-time (the gates off, or re-timing turned off
    in the RunSpec): nothing judged, and the note says why."""
    why = "the gates are off" if not result.spec.retime else "no rank re-timed its step"
    return Check("threshold", CheckStatus.NOTE, f"re-timing check not run: {why}")


def threshold_check(
    prediction: Prediction | None, measured: float, efficiency: float, why_none: str = ""
) -> Check:
    if prediction is None:
        because = f": {why_none}" if why_none else ""
        return Check("threshold", CheckStatus.NOTE, f"no prediction for this run{because}")
    floor = threshold(prediction, efficiency)
    figures = ThresholdFigures(
        predicted_tokens_per_sec=prediction.tokens_per_sec,
        threshold_tokens_per_sec=floor,
        efficiency=efficiency,
        bound=prediction.bound,
        bound_description=prediction.bound_description,
        link_class=prediction.link_class,
        ratio_to_predicted=measured / prediction.tokens_per_sec,
    )
    if measured < floor:
        message = failure_message(prediction, measured, efficiency)
        return Check("threshold", CheckStatus.FAIL, message, figures)
    message = (
        f"{measured:.4g} tok/s >= {efficiency:.0%} of the modelled {prediction.tokens_per_sec:.4g} "
        f"tok/s (bound: {prediction.bound_description})"
    )
    return Check("threshold", CheckStatus.OK, message, figures)
