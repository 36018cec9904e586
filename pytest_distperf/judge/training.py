"""The training run's own check (`distperf(mode="train")`): its first loss. Pure."""

from __future__ import annotations

import math

from pytest_distperf.judge.checks import Check, CheckStatus
from pytest_distperf.measured import RunResult

# How far the wrapped model's first loss may sit from one process's, relative: float32 sums in
# another order only; half precision rounds every product.
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2, "bf16-mixed": 2e-2}


def loss_check(result: RunResult) -> Check:
    """The first step's loss equals the loss of the same weights and batch in one process, to
    the precision's tolerance: every strategy trains the same function."""
    loss, reference = result.loss, result.reference_loss
    precision = result.spec.workload.precision
    tolerance = LOSS_TOLERANCE[precision]
    if loss is None or not math.isfinite(loss):
        return Check("loss", CheckStatus.FAIL, f"the first step's loss is {loss!r}")
    if reference is None:
        return Check(
            "loss",
            CheckStatus.NOTE,
            f"first-step loss {loss:.6g}; not compared: the whole model did not fit in one "
            "process beside the run",
        )
    difference = abs(loss - reference) / max(abs(reference), 1e-12)
    text = (
        f"first-step loss {loss:.6g}, one process {reference:.6g} (same weights and batch): "
        f"relative difference {difference:.1e}, tolerance {tolerance:g} ({precision})"
    )
    if difference > tolerance:
        return Check(
            "loss", CheckStatus.FAIL, text + f": {result.strategy} trains another function"
        )
    return Check("loss", CheckStatus.OK, text)
