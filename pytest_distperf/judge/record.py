"""One judged run as one typed value, and its one serialisation for the reports.

The gate (gate.py) builds a `JudgedRun` from a RunResult, its prediction and its checks;
`to_dict()` is its row of the JSON report (--distperf-json): the run's figures
(`RunResult.to_dict`) and the gate's, under names that users' scripts and CI templates read and
that do not change. The terminal table, JUnit properties, Markdown summary, pytest-benchmark
export and charts (output/) read that row. Pure: no I/O, no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from pytest_distperf.jsonfields import json_value
from pytest_distperf.judge.checks import (
    BaselineFigures,
    Check,
    CheckStatus,
    Decision,
    DetectableFigures,
    DeviceTimeFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
)
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import Calibration, Prediction

F = TypeVar("F")


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

    @property
    def ran(self) -> Mapping[str, Check]:
        """The checks that ran, by name (a skipped check reports nothing)."""
        checks = self.decision.checks
        return MappingProxyType({c.name: c for c in checks if c.status is not CheckStatus.SKIP})

    @property
    def threshold(self) -> ThresholdFigures | None:
        return _figures(self.ran.get("threshold"), ThresholdFigures)

    @property
    def baseline(self) -> BaselineFigures | None:
        return _figures(self.ran.get("baseline"), BaselineFigures)

    @property
    def relative_speed(self) -> RelativeSpeedFigures | None:
        return _figures(self.ran.get("relative_speed"), RelativeSpeedFigures)

    @property
    def detectable(self) -> BaselineFigures | DetectableFigures | None:
        """The smallest drop the baseline check catches, or would as a baseline of this run."""
        return _figures(self.ran.get("baseline"), BaselineFigures | DetectableFigures)

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
        for check in self.ran.values():
            row[f"{check.name}_status"] = check.status.value
            row[f"{check.name}_message"] = check.message
        if (threshold := self.threshold) is not None:
            row.update(
                predicted_tokens_per_sec=threshold.predicted_tokens_per_sec,
                threshold_tokens_per_sec=threshold.threshold_tokens_per_sec,
                efficiency=threshold.efficiency,
                bound=threshold.bound,
                bound_description=threshold.bound_description,
                link_class=threshold.link_class,
                ratio_to_predicted=threshold.ratio_to_predicted,
                threshold_check=threshold.check,
            )
        if (detectable := self.detectable) is not None:
            row["detectable_drop"] = detectable.detectable_drop
        if (baseline := self.baseline) is not None:
            row.update(
                baseline_tokens_per_sec=baseline.baseline_tokens_per_sec,
                change=baseline.change,
                tolerance=baseline.tolerance,
                tolerance_runs=baseline.tolerance_runs,
                p_value=baseline.p_value,
                baseline_verdict=baseline.verdict,
                baseline_recorded_at=baseline.recorded_at,
                baseline_commit=baseline.commit,
            )
            if baseline.machine is not None:
                row.update(json_value(baseline.machine))  # bare_, host_change, change_beyond_host
            if baseline.busy is not None:
                row["host_cpu_change"] = baseline.busy.host_cpu_change
            if baseline.waits is not None:
                row["off_cpu_share_change"] = baseline.waits.rise
        if (relative := self.relative_speed) is not None:
            row.update(
                relative_speed_baseline=relative.baseline,
                relative_speed_change=relative.change,
                relative_speed_tolerance=relative.tolerance,
                relative_speed_p_value=relative.p_value,
                relative_speed_detectable_drop=relative.detectable_drop,
                relative_speed_verdict=relative.verdict,
            )
        device_time = _figures(self.ran.get("device_time"), DeviceTimeFigures)
        if device_time is not None:
            row["device_time_change"] = device_time.change
        return row


def _figures(check: Check | None, kind: type[F]) -> F | None:
    figures = None if check is None else check.figures
    return figures if isinstance(figures, kind) else None
