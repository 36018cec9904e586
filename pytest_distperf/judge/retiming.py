"""The threshold where ranks time themselves (CPU ranks, one CUDA device): the re-timing check.

There no collective crosses a link that a model could charge, so the floor is the run's own
step timed again just after its repeats, the same way, with the knobs off (ranks/retime.py).
Its job is to catch a run slowed or disturbed while it was timed; a slower strategy or model is
the baseline's and the work gate's to catch. With several GPUs the modelled prediction judges.
"""

from __future__ import annotations

from pytest_distperf.judge.checks import Check, CheckStatus, ThresholdFigures
from pytest_distperf.spec import RunResult

RETIMING = "re-timing"
MODELLED = "model"
RETIMED_BOUND = "retimed"
RETIMED_WORDS = "the same step timed again just after the repeats"


def retiming_check(result: RunResult, efficiency: float, link_class: str = "") -> Check | None:
    """The timed repeats' rate against the re-timed step's; None where the ranks did not
    re-time it (several GPUs, or re-timing off): the modelled prediction judges there."""
    retimed = result.retimed_tokens_per_sec
    if not retimed:
        return None
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
    what = "step" if result.training else "generation"
    if ratio >= efficiency:
        message = (
            f"re-timing check: the timed repeats ran at {ratio:.0%} of {RETIMED_WORDS} "
            f"({measured:.4g} vs {retimed:.4g} tok/s; it fails below {efficiency:.0%})"
        )
        return Check("threshold", CheckStatus.OK, message, figures)
    message = (
        f"{result.strategy} on {result.devices} device(s), re-timing check: the timed repeats "
        f"ran at {ratio:.0%} of {RETIMED_WORDS} ({measured:.4g} vs {retimed:.4g} tok/s), below "
        f"{efficiency:.0%}.\n    The same wrapped {what} ran faster when timed again the same "
        "way with the knobs off (slowdown, comm_delay): the repeats were slowed while they were "
        "timed, by the timed loop itself or by the host then (a busy neighbour is excused only "
        "by its measured wait for a core: docs/gates.md)."
    )
    return Check("threshold", CheckStatus.FAIL, message, figures)
