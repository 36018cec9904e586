"""What a figure is (figures.py declares them all): how it is reduced from a run (`Reduction`
and the functions that make one), which reports show it (`Report`), its table, Markdown and
JUnit columns, and its value as plain JSON. Pure: no torch, no pytest."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Absent(enum.Enum):
    ABSENT = "absent"


#: What a reduction returns when the run has nothing under that name: the key is left out.
ABSENT = Absent.ABSENT


class Report(enum.Flag):
    """Where a figure is reported."""

    JSON = enum.auto()  # the --distperf-json row; RunResult.summary() for a run's own figures
    JUNIT = enum.auto()  # the test report's user_properties, `distperf_<name>` (JUnit XML)
    BENCHMARK_EXTRA = enum.auto()  # pytest-benchmark's extra_info
    MARKDOWN = enum.auto()  # the Markdown summary: a column, or the line of facts above it
    TABLE = enum.auto()  # a column of the terminal table


REPORT_JSON, JUNIT, BENCHMARK_EXTRA, MARKDOWN, TABLE = Report  # its flags, in order
SCALAR = REPORT_JSON | JUNIT | BENCHMARK_EXTRA  # what CI scripts and saved benchmarks read


class Source(enum.Enum):
    """What a reduction reads."""

    RUN = "run"  # the RunResult (every rank's results), when the run is recorded
    JUDGE = "judge"  # the judged record (judge/record.py): prediction, checks, baseline


@dataclass(frozen=True)
class Reduction:
    """How a figure's value comes about: in words, and as a function of its source."""

    how: str  # "median of repeats", "slowest rank", "rank 0's", "as asked", ...
    source: Source
    compute: Callable[[Any], Any]  # RunResult (RUN) or JudgedRun (JUDGE) -> value or ABSENT


def slowest(values: Iterable[Any], largest: Callable[[list[Any]], Any] = max) -> Any:
    """The slowest rank's value, the one definition: the largest of every rank's (`largest` says
    how for a record); None when some rank has none, since that rank may have been the
    slowest."""
    known = list(values)
    return None if not known or None in known else largest(known)


def slowest_known(values: Iterable[Any]) -> Any:
    """The largest of the ranks that have one; None where none has. For the whole model timed
    alone (and compiling it): any rank's timing of the same model stands for the run's."""
    known = [value for value in values if value is not None]
    return max(known) if known else None


def slowest_phases(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Seconds of each phase of a test, the slowest rank's (RankResult.phase_s); {} where some
    rank reported none."""
    if not per_rank or not all(per_rank):
        return {}
    names = dict.fromkeys(name for phases in per_rank for name in phases)
    return {name: max(phases.get(name, 0.0) for phases in per_rank) for name in names}


def from_result(attribute: str, how: str) -> Reduction:
    """A RunResult property that holds the arithmetic (per repeat, then over repeats)."""
    return Reduction(how, Source.RUN, lambda result: getattr(result, attribute))


def from_spec(attribute: str) -> Reduction:
    """What the test asked for (`RunSpec`)."""
    return Reduction("as asked", Source.RUN, lambda result: getattr(result.spec, attribute))


def first_rank(field: str) -> Reduction:
    """Rank 0's value: the same on every rank (the device's name, the implementation)."""
    return Reduction("rank 0's", Source.RUN, lambda result: getattr(result.ranks[0], field))


def each_rank(field: str) -> Reduction:
    """Every rank's value, in rank order, None for a rank without one."""
    return Reduction(
        "each rank's", Source.RUN, lambda result: tuple(getattr(r, field) for r in result.ranks)
    )


def slowest_rank(
    field: str, how: str = "slowest rank", largest: Callable[[list[Any]], Any] = max
) -> Reduction:
    """The slowest rank's value (repeats.slowest): the largest of every rank's, `largest` saying
    how for a record; None when some rank has none."""
    return Reduction(
        how, Source.RUN, lambda result: slowest((getattr(r, field) for r in result.ranks), largest)
    )


def slowest_known_rank(field: str) -> Reduction:
    """slowest_known over the ranks' `field`."""
    return Reduction(
        "slowest rank that has one",
        Source.RUN,
        lambda result: slowest_known(getattr(r, field) for r in result.ranks),
    )


def any_rank(field: str) -> Reduction:
    return Reduction("any rank", Source.RUN, lambda run: any(getattr(r, field) for r in run.ranks))


def every_rank(field: str) -> Reduction:
    """True where every rank's is (and there are ranks)."""
    return Reduction(
        "every rank",
        Source.RUN,
        lambda run: bool(run.ranks) and all(getattr(r, field) for r in run.ranks),
    )


def judged(path: str, how: str = "the gate's") -> Reduction:
    """A dotted path on the judged record (`threshold.bound`); ABSENT where a step on the way
    is None or missing (no threshold figures: the check had no prediction)."""

    def compute(record: Any) -> Any:
        value = record
        for step in path.split("."):
            if value is None:
                return ABSENT
            value = value.get(step) if isinstance(value, Mapping) else getattr(value, step)
        return value

    return Reduction(how, Source.JUDGE, compute)


@dataclass(frozen=True)
class TableColumn:
    """The figure's column in the terminal table."""

    header: str
    at: int  # position among the table's columns, left to right
    spec: str = ""  # format spec of the value: width, "<" for left-aligned, precision
    scale: float = 1.0  # shown as value x scale (seconds as milliseconds)
    sep: str = " "  # text before the column
    # (record, outcome) -> the value shown, when it is not the figure's own value alone
    cell: Callable[[Any, str], Any] | None = None

    def heading(self) -> str:
        return format(self.header, ("<" if self.spec.startswith("<") else ">") + str(self.width))

    @property
    def width(self) -> int:
        return int("".join(c for c in self.spec.split(".")[0] if c.isdigit()) or 0)

    def text(self, value: Any) -> str:
        """The value as the table shows it; "-" where the run has none."""
        if value is None or value is ABSENT:
            return "-".ljust(self.width) if self.spec.startswith("<") else "-".rjust(self.width)
        return format(value * self.scale if self.scale != 1 else value, self.spec)


#: How the Markdown summary can write a value (output/markdown.py renders each).
MARKDOWN_STYLES = ("code", "text", "count", "rate", "change", "ratio", "verdict")


@dataclass(frozen=True)
class MarkdownColumn:
    """The figure's column in the Markdown summary."""

    header: str
    at: int  # position among the summary's columns, left to right
    style: str  # one of MARKDOWN_STYLES


@dataclass(frozen=True)
class JUnitName:
    """A JUnit property named and scaled apart from the figure (ttft_s as `distperf_ttft_ms`)."""

    name: str
    scale: float = 1.0


@dataclass(frozen=True)
class Figure:
    """One figure of a run, and everywhere it is reported."""

    name: str  # the JSON key: never renamed (users' scripts and CI templates read it)
    unit: str  # "tok/s", "s", "bytes", ... ; "" for a ratio, a word or a record
    reduce: Reduction
    description: str
    reports: Report = REPORT_JSON
    table: TableColumn | None = None  # with TABLE
    markdown: MarkdownColumn | None = None  # with MARKDOWN; None: the facts line reads it
    junit_as: JUnitName | None = None  # with JUNIT, when the property is not `distperf_<name>`
    # What a saved report's value must be, where one is read back (the Markdown summary, charts).
    json_type: type | tuple[type, ...] | None = None

    def __post_init__(self) -> None:
        if (self.table is not None) != bool(self.reports & TABLE):
            raise ValueError(f"figure {self.name!r}: a table column goes with Report.TABLE")
        if self.markdown is not None and not self.reports & MARKDOWN:
            raise ValueError(f"figure {self.name!r}: a Markdown column needs Report.MARKDOWN")
        if self.junit_as is not None and not self.reports & JUNIT:
            raise ValueError(f"figure {self.name!r}: junit_as needs Report.JUNIT")

    @property
    def source(self) -> Source:
        return self.reduce.source

    @property
    def junit_name(self) -> str:
        return "distperf_" + (self.junit_as.name if self.junit_as else self.name)

    def junit_value(self, value: Any) -> Any:
        plain = json_value(value)
        if isinstance(plain, dict | list):  # a JUnit property holds text: a record as JSON
            return json.dumps(plain, sort_keys=True, separators=(",", ":"))
        scale = self.junit_as.scale if self.junit_as else 1.0
        return plain if scale == 1 else plain * scale


def json_value(value: Any) -> Any:
    """A figure's value as plain JSON: records as objects, tuples as lists, enums as words."""
    if isinstance(value, enum.Enum):
        return value.value
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    return value
