"""One judged run as one typed value, and its one serialisation for the reports.

The gate (gate.py) builds a `JudgedRun` from a RunResult, its prediction and its checks; the
terminal table, the Markdown summary and the pytest-benchmark export read its figures through
`value()`. Which figures there are, and which report shows each, is declared once in
pytest_distperf/figures.py (`RUN_FIGURES`): `to_json()` (the JSON report, --distperf-json) and
`junit_properties()` (`distperf_<field>`) write what is declared there, under names that users'
scripts and CI templates read and that do not change. Pure: no I/O, no pytest.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from pytest_distperf.figures import (
    ABSENT,
    JUNIT,
    REPORT_JSON,
    Figure,
    Report,
    Source,
    declared,
    figure,
    json_value,
)
from pytest_distperf.judge.checks import (
    BaselineFigures,
    Check,
    CheckStatus,
    Decision,
    DetectableFigures,
    RelativeSpeedFigures,
    ThresholdFigures,
)
from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel import Calibration, Prediction

F = TypeVar("F")


class FigureValues(Mapping[str, Any]):
    """Figures by name, read-only; each is an attribute too (`values.tokens_per_sec`), and one
    that is not there raises AttributeError naming it rather than reading as missing."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", {k: _frozen(v) for k, v in values.items()})

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no figure {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self._values),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values!r})"


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return MappingProxyType(dict(value))
    return value


class RunFigures(FigureValues):
    """What one run measured: every figure declared with `Source.RUN`, reduced from the ranks'
    results (figures.py says how) when the run is recorded; `run.tokens_per_sec` reads one."""

    __slots__ = ()

    @classmethod
    def of(cls, result: RunResult) -> RunFigures:
        return cls({f.name: f.reduce.compute(result) for f in declared(source=Source.RUN)})


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

    def value(self, declared_figure: Figure | str) -> Any:
        """A declared figure's value for this run: None where the run has none, ABSENT where
        it has nothing to report under that name (a check that did not run)."""
        if isinstance(declared_figure, str):
            declared_figure = figure(declared_figure)
        if declared_figure.source is Source.RUN:
            # AttributeError for a figure the run was not recorded with, never a silent "-"
            return getattr(self.run, declared_figure.name)
        return declared_figure.reduce.compute(self)

    def reported(self, report: Report, *, nulls: bool = False) -> list[tuple[Figure, Any]]:
        """The figures declared for `report`, in order, with this run's values: those it has
        nothing to report under left out, and those without a value (None) unless `nulls`."""
        pairs = [(f, self.value(f)) for f in declared(report)]
        return [(f, v) for f, v in pairs if v is not ABSENT and (nulls or v is not None)]

    def to_json(self) -> dict[str, Any]:
        """The row of the JSON report: plain JSON values, field names kept across versions."""
        return {f.name: json_value(value) for f, value in self.reported(REPORT_JSON, nulls=True)}

    def junit_properties(self) -> list[tuple[str, Any]]:
        """(name, value) pairs for the test report's `user_properties` (JUnit XML), in the
        declared order; a figure without a value is left out."""
        return [(f.junit_name, f.junit_value(value)) for f, value in self.reported(JUNIT)]


def _figures(check: Check | None, kind: type[F]) -> F | None:
    figures = None if check is None else check.figures
    return figures if isinstance(figures, kind) else None
