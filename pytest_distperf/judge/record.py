"""One judged run as one typed value; `to_dict()` is its row of the JSON report, the run's
figures and the gate's under names users' scripts read, which every output/ module reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
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
        cls, result: RunResult, decision: Decision, *, session_started_at: float, **fields: Any
    ) -> JudgedRun:
        """The record; the first timed token from the session's start is the slowest rank's."""
        first_timed = max(r.timed_from for r in result.ranks)
        return cls(
            result, decision, session_to_first_timed_s=first_timed - session_started_at, **fields
        )

    @property
    def bandwidth_utilization(self) -> float | None:
        """Weight bytes a rank reads per forward x forwards/sec over the calibrated copy
        bandwidth; None without a prediction or a calibration."""
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
    if isinstance(figures, ThresholdFigures | DetectableFigures):
        return asdict(figures)
    if isinstance(figures, BaselineFigures):
        keys = {"runs_needed": "baseline_runs_needed", "verdict": "baseline_verdict"}
        keys |= {"recorded_at": "baseline_recorded_at", "commit": "baseline_commit"}
        row = {keys.get(f.name, f.name): getattr(figures, f.name) for f in fields(figures)}
        del row["waits"]
        return row | ({} if figures.waits is None else {"off_cpu_share_change": figures.waits.rise})
    if isinstance(figures, RelativeSpeedFigures):
        return {f"relative_speed_{name}": value for name, value in asdict(figures).items()}
    if isinstance(figures, DeviceTimeFigures):
        return {"device_time_change": figures.change}
    return {}
