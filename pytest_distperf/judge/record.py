"""One judged run as one typed value, and its one serialisation for the reports.

The gate (gate.py) builds a `JudgedRun` from a RunResult, its prediction and its checks; the
terminal table, the Markdown summary and the pytest-benchmark export read its attributes.
`to_json()` is the only place that names the fields of the JSON report (--distperf-json), and
`junit_properties()`, built on it, the only place that names the JUnit properties
(`distperf_<field>`): users' scripts and CI templates read both, so the names do not change.
Pure: no I/O, no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from pytest_distperf.judge.checks import (
    BaselineFigures,
    Check,
    CheckStatus,
    Decision,
    DetectableFigures,
    Figures,
    RelativeSpeedFigures,
    ThresholdFigures,
)
from pytest_distperf.perfmodel import Calibration, Prediction
from pytest_distperf.spec import Implementation, RunResult, Workload

F = TypeVar("F")

# The row's scalars that ride on the test report as JUnit XML properties, in this order, then
# `distperf_ttft_ms`; a field without a value is left out.
REPORTED_FIELDS = (
    "tokens_per_sec",
    "decode_tokens_per_sec",
    "strategy",
    "devices",
    "accelerator",
    "topology_key",
    "predicted_tokens_per_sec",
    "threshold_tokens_per_sec",
    "bound",
    "baseline_tokens_per_sec",
    "change",
    "tolerance",
    "detectable_drop",
    "relative_speed",
    "relative_speed_change",
    "relative_speed_detectable_drop",
    "bare_change",
    "host_change",
    "change_beyond_host",
    "verdict",
    "peak_memory_bytes",
)


@dataclass(frozen=True)
class RunFigures:
    """What one run measured, every rank's figures reduced (spec.RunResult defines each)."""

    test_id: str
    strategy: str
    devices: int
    accelerator: str
    workload: Workload
    repeats: int
    warmup: int
    tokens_per_sec: float
    tokens_per_sec_samples: tuple[float, ...]
    decode_tokens_per_sec: float | None
    aggregate_tokens_per_sec: float
    ttft_s: float | None  # None for a user's own generation loop (no prefill/decode split)
    peak_memory_bytes: int
    peak_memory_per_rank: tuple[int, ...]
    memory_kind: str
    implementation: Implementation
    device_name: str
    versions: Mapping[str, str]
    launch_s: float
    startup_s: float
    reference_token_s: float | None
    relative_speed: float | None
    relative_speed_samples: tuple[float, ...]
    host_loop_samples: tuple[float, ...]
    work_s: float | None = None
    harness_s: float | None = None
    compile_s: float | None = None
    compiled: str = ""
    cuda_graphs: bool = False
    graph_breaks: bool = False

    @classmethod
    def of(cls, result: RunResult) -> RunFigures:
        first = result.ranks[0]
        return cls(
            test_id=result.spec.test_id,
            strategy=result.strategy,
            devices=result.devices,
            accelerator=result.spec.accelerator,
            workload=result.spec.workload,
            repeats=result.spec.repeats,
            warmup=result.spec.warmup,
            tokens_per_sec=result.tokens_per_sec,
            tokens_per_sec_samples=result.tokens_per_sec_samples,
            decode_tokens_per_sec=result.decode_tokens_per_sec,
            aggregate_tokens_per_sec=result.aggregate_tokens_per_sec,
            ttft_s=result.ttft_s,
            peak_memory_bytes=result.peak_memory_bytes,
            peak_memory_per_rank=tuple(r.peak_memory_bytes for r in result.ranks),
            memory_kind=first.memory_kind,
            implementation=result.implementation,
            device_name=first.device_name,
            versions=MappingProxyType(dict(result.versions)),
            launch_s=result.launch_s,
            startup_s=result.startup_s,
            reference_token_s=result.reference_token_s,
            relative_speed=result.relative_speed,
            relative_speed_samples=result.relative_speed_samples,
            host_loop_samples=result.host_loop_samples,
            work_s=result.work_s,
            harness_s=result.harness_s,
            compile_s=result.compile_s,
            compiled=first.compiled,
            cuda_graphs=result.cuda_graphs,
            graph_breaks=result.graph_breaks,
        )


@dataclass(frozen=True)
class JudgedRun:
    """A run, what it was held to, and what came of it."""

    run: RunFigures
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
            run=RunFigures.of(result),
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
    def threshold(self) -> ThresholdFigures | None:
        return _figures(self.decision.threshold, ThresholdFigures)

    @property
    def baseline(self) -> BaselineFigures | None:
        return _figures(self.decision.baseline, BaselineFigures)

    @property
    def relative_speed(self) -> RelativeSpeedFigures | None:
        return _figures(self.decision.relative_speed, RelativeSpeedFigures)

    @property
    def detectable_drop(self) -> float | None:
        """The smallest drop the baseline check catches, or would as a baseline of this run."""
        figures = self.decision.baseline.figures
        if isinstance(figures, BaselineFigures | DetectableFigures):
            return figures.detectable_drop
        return None

    def to_json(self) -> dict[str, Any]:
        """The row of the JSON report: plain JSON values, field names kept across versions."""
        run = self.run
        row: dict[str, Any] = {
            "test_id": run.test_id,
            "strategy": run.strategy,
            "devices": run.devices,
            "accelerator": run.accelerator,
            "workload": run.workload.params(),
            "repeats": run.repeats,
            "warmup": run.warmup,
            "tokens_per_sec": run.tokens_per_sec,
            "tokens_per_sec_samples": list(run.tokens_per_sec_samples),
            "decode_tokens_per_sec": run.decode_tokens_per_sec,
            "aggregate_tokens_per_sec": run.aggregate_tokens_per_sec,
            "ttft_s": run.ttft_s,
            "peak_memory_bytes": run.peak_memory_bytes,
            "peak_memory_per_rank": list(run.peak_memory_per_rank),
            "memory_kind": run.memory_kind,
            "implementation": vars(run.implementation).copy(),
            "device_name": run.device_name,
            "versions": dict(run.versions),
            "launch_s": run.launch_s,
            "startup_s": run.startup_s,
            "reference_token_s": run.reference_token_s,
            "relative_speed": run.relative_speed,
            "relative_speed_samples": list(run.relative_speed_samples),
            "host_loop_samples": list(run.host_loop_samples),
            "work_s": run.work_s,
            "harness_s": run.harness_s,
            "compile_s": run.compile_s,
            "compiled": run.compiled,
            "cuda_graphs": run.cuda_graphs,
            "graph_breaks": run.graph_breaks,
            "bandwidth_utilization": self.bandwidth_utilization,
            "verdict": self.decision.verdict,
        }
        for check in self.decision.checks:
            row.update(_check_json(check))
        row.update(
            topology_key=self.topology_key,
            baseline_recorded=self.baseline_recorded,
            prediction=self.prediction.to_dict() if self.prediction else None,
            calibration=self.calibration.to_dict() if self.calibration else None,
            session_to_first_timed_s=self.session_to_first_timed_s,
        )
        return row

    def junit_properties(self) -> list[tuple[str, Any]]:
        """(name, value) pairs for the test report's `user_properties` (JUnit XML)."""
        row = self.to_json()
        properties = [(f"distperf_{k}", row[k]) for k in REPORTED_FIELDS if row.get(k) is not None]
        if self.run.ttft_s is None:
            return properties
        return [*properties, ("distperf_ttft_ms", self.run.ttft_s * 1000)]


def _figures(check: Check, kind: type[F]) -> F | None:
    return check.figures if isinstance(check.figures, kind) else None


def _check_json(check: Check) -> dict[str, Any]:
    # A check that did not run leaves no trace, as in reports written before it could be
    # skipped: readers take a missing status for "not judged".
    if check.status is CheckStatus.SKIP:
        return {}
    return {
        **_figures_json(check.figures),
        f"{check.name}_status": check.status.value,
        f"{check.name}_message": check.message,
    }


def _figures_json(figures: Figures | None) -> dict[str, Any]:
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
    if isinstance(figures, BaselineFigures):
        machine = figures.machine
        return {
            "baseline_tokens_per_sec": figures.baseline_tokens_per_sec,
            "change": figures.change,
            "tolerance": figures.tolerance,
            "tolerance_runs": figures.tolerance_runs,
            "p_value": figures.p_value,
            "detectable_drop": figures.detectable_drop,
            "baseline_verdict": figures.verdict,
            "baseline_recorded_at": figures.recorded_at,
            "baseline_commit": figures.commit,
            **(
                {}
                if machine is None
                else {
                    "bare_change": machine.bare_change,
                    "host_change": machine.host_change,
                    "change_beyond_host": machine.change_beyond_host,
                }
            ),
        }
    if isinstance(figures, DetectableFigures):
        return {"detectable_drop": figures.detectable_drop}
    if isinstance(figures, RelativeSpeedFigures):
        return {
            "relative_speed_baseline": figures.baseline,
            "relative_speed_change": figures.change,
            "relative_speed_tolerance": figures.tolerance,
            "relative_speed_p_value": figures.p_value,
            "relative_speed_detectable_drop": figures.detectable_drop,
            "relative_speed_verdict": figures.verdict,
        }
    return {}
