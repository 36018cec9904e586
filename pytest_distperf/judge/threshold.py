"""The threshold, one of two named checks: where ranks time themselves (CPU ranks, one CUDA
device) the re-timing check; where they cannot (several GPUs) the modelled one, the rate the
links and the calibration predict (perfmodel/), which `distperf predict` shows too.

Where ranks time themselves no collective crosses a link that a model could charge, so the
floor is the run's own step timed again just after its repeats, the same way, with the knobs
off (ranks/retime.py), with the bare model beside it where one ran beside the repeats. Its job
is to catch a run slowed or disturbed while it was timed; a slower strategy or model is the
baseline's and the work gate's to catch.
"""

from __future__ import annotations

import statistics

from pytest_distperf.judge.checks import RETIMING, Check, CheckStatus, ThresholdFigures
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import Prediction, failure_message, threshold
from pytest_distperf.spec import ranks_time_themselves

RETIMED_BOUND = "retimed"
RETIMED_WORDS = "the same step timed again just after the repeats"


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
        why = "the gates are off" if not result.spec.retime else "no rank re-timed its step"
        return Check("threshold", CheckStatus.NOTE, f"re-timing check not run: {why}")
    return threshold_check(prediction, result.tokens_per_sec, efficiency, why_none)


def retiming_check(result: RunResult, efficiency: float, link_class: str = "") -> Check | None:
    """The timed repeats against the re-timed step, as timed and, where the bare model ran
    beside both, as speeds relative to it; a run fails only where both views say its repeats
    ran slow (the host's drift moves the first, a short bare model's noise the second). None
    where the ranks did not re-time (several GPUs, or re-timing off)."""
    rate = result.retimed_tokens_per_sec
    if not rate:
        return None
    measured = result.tokens_per_sec
    ratio = measured / rate
    said = (
        f"the timed repeats ran at {ratio:.0%} of the same step timed again just "
        f"after them ({measured:.4g} vs {rate:.4g} tok/s)"
    )
    during, after = result.relative_speed_samples, result.retimed_relative_speed_samples
    both = ""
    if during and after:
        during_s, after_s = statistics.median(during), statistics.median(after)
        beside_bare, both = during_s / after_s, "both "
        said += (
            f", and at {beside_bare:.0%} of it against the bare model beside each "
            f"({during_s:.3g} x bare in the repeats, {after_s:.3g} x bare re-timed)"
        )
        ratio = max(ratio, beside_bare)
    judged_rate = measured / ratio
    figures = ThresholdFigures(
        predicted_tokens_per_sec=judged_rate,
        threshold_tokens_per_sec=efficiency * judged_rate,
        efficiency=efficiency,
        bound=RETIMED_BOUND,
        bound_description=RETIMED_WORDS,
        link_class=link_class,
        ratio_to_predicted=ratio,
        check=RETIMING,
    )
    if ratio >= efficiency:
        message = f"re-timing check: {said}; it fails below {efficiency:.0%}"
        return Check("threshold", CheckStatus.OK, message, figures)
    what = "step" if result.training else "generation"
    message = (
        f"{result.strategy} on {result.devices} device(s), re-timing check: {said}, {both}below "
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
