"""The threshold, one of two named checks: where ranks time themselves (CPU ranks, one CUDA
device) the re-timing check; where they cannot (several GPUs) the modelled one, the rate the
links and the calibration predict (perfmodel/), which `distperf predict` shows too.

Where ranks time themselves no collective crosses a link that a model could charge, so the
floor is the run's own step timed again just after its repeats, the same way, with the knobs
off (ranks/retime.py).
Where the bare model ran beside each repeat it ran beside each re-timing too, and the two are
compared as speeds relative to it: this host's speed drifts between seconds, the pair alike.
Its job is to catch a run slowed or disturbed while it was timed; a slower strategy or model is
the baseline's and the work gate's to catch. With several GPUs the modelled prediction judges.
"""

from __future__ import annotations

import statistics

from pytest_distperf.judge.checks import Check, CheckStatus, ThresholdFigures
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import Prediction, failure_message, threshold

RETIMING = "re-timing"
MODELLED = "model"
RETIMED_BOUND = "retimed"
RETIMED_WORDS = "the same step timed again just after the repeats"


def retimed_rate(result: RunResult) -> tuple[float, str] | None:
    """The re-timed step's rate at the repeats' host speed, and how it was had: the repeats'
    rate over their speed relative to the bare model as a share of the re-timing's, where
    both had the bare model beside them, else the re-timed rate itself; None where the ranks
    did not re-time."""
    retimed = result.retimed_tokens_per_sec
    if not retimed:
        return None
    during, after = result.relative_speed_samples, result.retimed_relative_speed_samples
    if not during or not after:
        return retimed, ""
    share = statistics.median(during) / statistics.median(after)
    how = (
        f"; each against the bare model beside it: {statistics.median(during):.3g} x bare in "
        f"the repeats, {statistics.median(after):.3g} x bare re-timed ({retimed:.4g} tok/s as "
        "re-timed, the host's speed then)"
    )
    return result.tokens_per_sec / share, how


def retiming_check(result: RunResult, efficiency: float, link_class: str = "") -> Check | None:
    """The timed repeats' rate against the re-timed step's; None where the ranks did not
    re-time it (several GPUs, or re-timing off): the modelled prediction judges there."""
    rate = retimed_rate(result)
    if rate is None:
        return None
    retimed, how = rate
    measured = result.tokens_per_sec
    ratio = measured / retimed
    figures = ThresholdFigures(
        predicted_tokens_per_sec=retimed,
        threshold_tokens_per_sec=efficiency * retimed,
        efficiency=efficiency,
        bound=RETIMED_BOUND,
        bound_description=RETIMED_WORDS,
        link_class=link_class,
        ratio_to_predicted=ratio,
        check=RETIMING,
    )
    said = (
        f"the timed repeats ran at {ratio:.0%} of the same step timed again just after them "
        f"({measured:.4g} vs {retimed:.4g} tok/s{how})"
    )
    if ratio >= efficiency:
        message = f"re-timing check: {said}; it fails below {efficiency:.0%}"
        return Check("threshold", CheckStatus.OK, message, figures)
    what = "step" if result.training else "generation"
    message = (
        f"{result.strategy} on {result.devices} device(s), re-timing check: {said}, below "
        f"{efficiency:.0%}.\n    The same wrapped {what} ran faster when timed again the same "
        "way with the knobs off (slowdown, comm_delay): the repeats were slowed while they were "
        "timed, by the timed loop itself or by the host then (a busy neighbour is excused only "
        "by its measured wait for a core: docs/gates.md)."
    )
    return Check("threshold", CheckStatus.FAIL, message, figures)


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
