"""One judged run as one typed value, and its one serialisation for the reports.

The gate (gate.py) builds a `JudgedRun` from a RunResult, its prediction and its checks;
`to_dict()` is its row of the JSON report (--distperf-json): the run's figures
(`RunResult.to_dict`) and the gate's, under names that users' scripts and CI templates read and
that do not change. The terminal table, JUnit properties, Markdown summary, pytest-benchmark
export and charts (output/) read that row. Pure: no I/O, no pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_distperf.jsonfields import json_value
from pytest_distperf.judge.checks import (
    BaselineFigures,
    CheckStatus,
    Decision,
    DetectableFigures,
    DeviceTimeFigures,
    Figures,
    RelativeSpeedFigures,
    ThresholdFigures,
)
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import Calibration, Prediction


@dataclass(frozen=True)
class JudgedRun:
    """A run, what it was held to, and what came of it."""

    run: RunResult
    decision: Decision
    prediction: Prediction | None  # None: nothing to predict from (a user's own builder)
    topology_key: str
    baseline_recorded: bool  # this run became the baseline (--distperf-update-baselines)
    calibration: Calibration | None  # the session's, for this run's rank count
    session_to_first_timed_s: float  # pytest start to this run's first timed token

    @classmethod
    def of(
        cls,
        result: RunResult,
        decision: Decision,
        *,
        prediction: Prediction | None,
        topology_key: str,
        baseline_recorded: bool,
        calibration: Calibration | None,
        session_started_at: float,
    ) -> JudgedRun:
        return cls(
            run=result,
            decision=decision,
            prediction=prediction,
            topology_key=topology_key,
            baseline_recorded=baseline_recorded,
            calibration=calibration,
            session_to_first_timed_s=max(r.timed_from for r in result.ranks) - session_started_at,
        )

    @property
    def bandwidth_utilization(self) -> float | None:
        """Share of the measured device copy bandwidth that the weights read reach: weight
        bytes a rank reads per forward x forwards/sec (decode tok/s over the batch size) over
        the copy bandwidth (the calibration's). None without a prediction or a calibration."""
        calibration, prediction = self.calibration, self.prediction
        if prediction is None or calibration is None or not calibration.memory_bandwidth:
            return None
        weights = prediction.bytes_per_token.get("weights_read")
        rate = self.run.decode_tokens_per_sec or self.run.tokens_per_sec
        if not weights or not rate:
            return None
        # a forward reads the weights once and yields a token for every batch row
        return weights * rate / prediction.batch_size / calibration.memory_bandwidth

    def to_dict(self) -> dict[str, Any]:
        """The row of the JSON report: the run's figures, then the gate's, as plain JSON. A
        check that did not run leaves its keys out; a figure the run has not is null."""
        row = self.run.to_dict()
        row.update(
            topology_key=self.topology_key,
            verdict=self.decision.verdict,
            busy_evidence=json_value(self.decision.busy_evidence),
            bandwidth_utilization=self.bandwidth_utilization,
            baseline_recorded=self.baseline_recorded,
            prediction=json_value(self.prediction),
            calibration=json_value(self.calibration),
            session_to_first_timed_s=self.session_to_first_timed_s,
        )
        for check in self.decision.checks:
            if check.status is not CheckStatus.SKIP:  # a skipped check reports nothing
                row[f"{check.name}_status"] = check.status.value
                row[f"{check.name}_message"] = check.message
                row.update(_figure_keys(check.figures))
        return row


def _figure_keys(figures: Figures | None) -> dict[str, Any]:
    """A check's figures under the keys the JSON report has always called them."""
    if isinstance(figures, ThresholdFigures):
        return {
            "predicted_tokens_per_sec": figures.predicted_tokens_per_sec,
            "threshold_tokens_per_sec": figures.threshold_tokens_per_sec,
            "efficiency": figures.efficiency,
            "bound": figures.bound,
            "bound_description": figures.bound_description,
            "link_class": figures.link_class,
            "ratio_to_predicted": figures.ratio_to_predicted,
        }
    if isinstance(figures, DetectableFigures):  # the baseline check's, without a baseline
        return {"detectable_drop": figures.detectable_drop}
    if isinstance(figures, BaselineFigures):
        waits = figures.waits
        return {
            "baseline_tokens_per_sec": figures.baseline_tokens_per_sec,
            "change": figures.change,
            "tolerance": figures.tolerance,
            "tolerance_runs": figures.tolerance_runs,
            "baseline_runs_needed": figures.runs_needed,
            "p_value": figures.p_value,
            "detectable_drop": figures.detectable_drop,
            "baseline_verdict": figures.verdict,
            "baseline_recorded_at": figures.recorded_at,
            "baseline_commit": figures.commit,
            **({} if waits is None else {"off_cpu_share_change": waits.rise}),
        }
    if isinstance(figures, RelativeSpeedFigures):
        return {
            "relative_speed_baseline": figures.baseline,
            "relative_speed_change": figures.change,
            "relative_speed_tolerance": figures.tolerance,
            "relative_speed_p_value": figures.p_value,
            "relative_speed_detectable_drop": figures.detectable_drop,
            "relative_speed_verdict": figures.verdict,
        }
    if isinstance(figures, DeviceTimeFigures):
        return {"device_time_change": figures.change}
    return {}
