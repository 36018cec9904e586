"""The threshold: the run against `efficiency` x the modelled, links-aware prediction
(perfmodel/), judged wherever ranks exchange collectives; on one device a note. Pure."""

from __future__ import annotations

from pytest_distperf.judge.checks import Check, CheckStatus, ThresholdFigures
from pytest_distperf.perfmodel import Prediction, failure_message, threshold

# (accelerator, strategy, mode) whose prediction does not hold yet, with where the measured
# ratios are: such a run gets a note naming its ratio, never a failure or another check.
# Training on CPU ranks: even with a whole copy's step paired beside each timed one, the model
# underprices the wrapped step and tp's in-step probe drifts.
UNMODELLED: dict[tuple[str, str, str], str] = {
    ("cpu", strategy, "train"): "docs/benchmarks/cpu-2026-12-06-night.md"
    for strategy in ("auto", "ddp", "fsdp", "fsdp2", "fsdp-noreshard", "tp")
}


def threshold_check(
    prediction: Prediction | None,
    measured: float,
    efficiency: float,
    *,
    devices: int,
    accelerator: str,
    strategy: str,
    mode: str,
    why_none: str = "",
) -> Check:
    """Fails below `efficiency` x the prediction; a note on one device, where the ranks exchange
    no collectives, and where UNMODELLED."""
    if prediction is None:
        because = f": {why_none}" if why_none else ""
        return Check("threshold", CheckStatus.NOTE, f"no prediction for this run{because}")
    floor = threshold(prediction, efficiency)
    ratio = measured / prediction.tokens_per_sec
    figures = ThresholdFigures(
        predicted_tokens_per_sec=prediction.tokens_per_sec,
        threshold_tokens_per_sec=floor,
        efficiency=efficiency,
        bound=prediction.bound,
        bound_description=prediction.bound_description,
        link_class=prediction.link_class,
        ratio_to_predicted=ratio,
    )
    said = (
        f"{measured:.4g} tok/s, {ratio:.0%} of the modelled {prediction.tokens_per_sec:.4g} "
        f"tok/s (bound: {prediction.bound_description})"
    )
    unmodelled = UNMODELLED.get((accelerator, strategy, mode))
    why_not = ""
    if devices < 2:
        why_not = "one device exchanges no collectives over links"
    elif not (prediction.counted_collectives or prediction.expected_collectives):
        # replicated decode: the prediction is the rank's own compute, timed apart from the run
        why_not = "the ranks exchange no collectives per token"
    elif unmodelled:
        why_not = (
            f"the model does not yet hold for {strategy} ({mode}) on {accelerator} ranks, "
            f"measured ratios in {unmodelled}"
        )
    if why_not:
        return Check("threshold", CheckStatus.NOTE, f"{said}; not judged: {why_not}", figures)
    if measured < floor:
        message = failure_message(prediction, measured, efficiency)
        return Check("threshold", CheckStatus.FAIL, message, figures)
    return Check("threshold", CheckStatus.OK, f"{said} >= {efficiency:.0%} of it", figures)
