"""A baseline entry: one test's stored measurement on one topology, its schema and validation.
Checked whole when made, from samples or a file, so the store can read back whatever it writes;
a hand edit into something else raises ValueError naming the first problem. Pure."""

from __future__ import annotations

import json
import math
import numbers
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from pytest_distperf.jsonfields import get_field, is_count, is_number, json_object, json_value
from pytest_distperf.work import Work

# One schema: a file of any other is refused, naming it (record the baselines again).
SCHEMA = 7
# Recorded runs kept per test: enough to measure the host's drift, few enough that a deliberate
# change of speed leaves the window.
RUN_HISTORY = 10

_WAIT_FIELDS = ("run_queue_wait_run_medians", "steal_run_medians", "off_cpu_share_run_medians")
# One value per recorded run, extended by every refresh (`following`).
_HISTORIES = (
    "relative_run_medians",
    "host_loop_run_medians",
    "host_cpu_run_medians",
    "device_time_run_medians",
    *_WAIT_FIELDS,
)
_LIST_FIELDS = ("run_medians", "relative_samples", *_HISTORIES)
# When and at which commit each recorded run was made (strings, not numbers).
_RUN_RECORDS = ("run_recorded_at", "run_commits")
# Left out: the work when the run was not counted; the run records where none were kept.
_OPTIONAL_ENTRY_FIELDS = frozenset({*_RUN_RECORDS, "work"})
# Throughput noise is percent-level: six significant digits keep the file's diffs short.
_SIGNIFICANT_DIGITS = 6
# 1.4826 * MAD estimates the standard deviation for normal data (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class BaselineEntry:
    """The stored measurement of one test on one topology."""

    test_id: str  # node id and workload (judge/gate.py builds it)
    samples: tuple[float, ...]  # tokens/sec of each repeat: the rest summarizes them
    median: float
    dispersion: float  # 1.4826 * MAD / median: a CV one wild repeat cannot inflate
    stdev: float  # tokens/sec, 0 for a single sample
    n: int
    peak_memory_bytes: int | None
    recorded_at: str  # ISO 8601 UTC
    commit: str | None = None
    # Frozen into read-only views in __post_init__ and left out of the hash.
    versions: Mapping[str, str] = field(default_factory=dict, hash=False)
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)  # free-form JSON
    #: Medians of the last RUN_HISTORY runs recorded for this test on this topology, oldest
    #: first, this entry's own last: how much whole runs drift, which the repeats cannot show.
    run_medians: tuple[float, ...] = ()
    #: Speed relative to the bare model of each repeat, and its recorded runs' medians.
    relative_samples: tuple[float, ...] = ()
    relative_run_medians: tuple[float, ...] = ()
    #: Of each recorded run, oldest first (empty: unknown): the host-speed loop's seconds,
    host_loop_run_medians: tuple[float, ...] = ()
    #: the counted work of the latest recorded run (work.py; None when not counted),
    work: Work | None = None
    #: the slowest rank's CPU time per new token and, on CUDA, kernel time per decode token,
    host_cpu_run_medians: tuple[float, ...] = ()
    device_time_run_medians: tuple[float, ...] = ()
    #: per new token the slowest rank's wait for a core and the host's steal (zero is a level),
    run_queue_wait_run_medians: tuple[float, ...] = ()
    steal_run_medians: tuple[float, ...] = ()
    #: the largest share of a rank's generation time off the CPU by its own doing,
    off_cpu_share_run_medians: tuple[float, ...] = ()
    #: and when and at which commit (None: unknown) it was made.
    run_recorded_at: tuple[str, ...] = ()
    run_commits: tuple[str | None, ...] = ()

    def __post_init__(self) -> None:
        test_id = self.test_id  # an entry's key: a non-empty string of one line
        if not isinstance(test_id, str) or not test_id.strip():
            raise ValueError(f"test id must be a non-empty string, got {test_id!r}")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in test_id):
            raise ValueError(f"test id {test_id!r} contains control characters")
        if not self.samples:
            raise ValueError(f"{test_id}: no samples")
        for name in ("samples", *_LIST_FIELDS):  # a wait may be zero: no wait at all
            values = checked_numbers(getattr(self, name), test_id, name, zero=name in _WAIT_FIELDS)
            object.__setattr__(self, name, values)
        if not is_count(self.n) or self.n != len(self.samples):
            raise ValueError(f"{test_id}: n={self.n!r} but there are {len(self.samples)} samples")
        median = statistics.median(self.samples)
        if not is_number(self.median) or not math.isclose(self.median, median, rel_tol=1e-5):
            raise ValueError(
                f"{test_id}: median {self.median!r} does not match the samples' median {median!r}"
            )
        for name in ("dispersion", "stdev"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{test_id}: {name} must be a non-negative number")
        if self.peak_memory_bytes is not None and not is_count(self.peak_memory_bytes):
            raise ValueError(f"{test_id}: peak_memory_bytes must be a non-negative int or None")
        if self.commit is not None and not isinstance(self.commit, str):
            raise ValueError(f"{test_id}: commit must be a string or None")
        if not isinstance(self.versions, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.versions.items()
        ):
            raise ValueError(f"{test_id}: versions must map package names to version strings")
        try:
            # Rejects what save() could not write, and deep-copies the caller's dict.
            extra = json.loads(json.dumps(dict(self.extra), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{test_id}: extra must be JSON-serializable ({exc})") from exc
        runs = max(len(self.run_medians), 1)
        for name in _RUN_RECORDS:
            values = tuple(getattr(self, name))
            if len(values) > runs:
                raise ValueError(
                    f"{test_id}: {name} has {len(values)} values for {runs} recorded runs"
                )
            object.__setattr__(self, name, values)
        for value in (self.recorded_at, *self.run_recorded_at):
            _parse_timestamp(value, test_id)
        if not all(c is None or isinstance(c, str) for c in self.run_commits):
            raise ValueError(f"{test_id}: run_commits must be strings or null")
        object.__setattr__(self, "versions", MappingProxyType(dict(sorted(self.versions.items()))))
        object.__setattr__(self, "extra", MappingProxyType(extra))

    @classmethod
    def from_samples(
        cls,
        test_id: str,
        samples: Iterable[float],
        peak_memory_bytes: int | None,
        versions: Mapping[str, str],
        commit: str | None = None,
        now: datetime | None = None,
        extra: Mapping[str, Any] | None = None,
        relative_samples: Iterable[float] = (),
        host_loop_samples: Iterable[float] = (),
        work: Work | None = None,
        host_cpu_per_token_s: float | None = None,
        device_time_per_token_s: float | None = None,
        waits: Mapping[str, float | None] | None = None,
    ) -> BaselineEntry:
        """An entry of one run from its raw repeats and figures, with the summary statistics."""
        rounded = _rounded(samples, test_id, "samples")
        if not rounded:
            raise ValueError(f"{test_id}: no samples")
        relative = _rounded(relative_samples, test_id, "relative_samples")
        host = _rounded(host_loop_samples, test_id, "host_loop_samples")
        when = datetime.now(timezone.utc) if now is None else now
        recorded_at = when.astimezone(timezone.utc).isoformat(timespec="seconds")
        median = _round(statistics.median(rounded))
        # a zero time per token (a profile without kernels) is no level to compare with
        times = {"host_cpu_run_medians": host_cpu_per_token_s or None}
        times["device_time_run_medians"] = device_time_per_token_s or None
        waits = dict(waits or {})
        return cls(
            test_id=test_id,
            samples=rounded,
            median=median,
            dispersion=_round(relative_spread(rounded)),
            stdev=_round(statistics.stdev(rounded)) if len(rounded) > 1 else 0.0,
            n=len(rounded),
            peak_memory_bytes=peak_memory_bytes,
            recorded_at=recorded_at,
            commit=commit,
            run_recorded_at=(recorded_at,),
            run_commits=(commit,),
            versions=dict(versions),
            extra=dict(extra or {}),
            run_medians=(median,),
            relative_samples=relative,
            relative_run_medians=(_round(statistics.median(relative)),) if relative else (),
            host_loop_run_medians=(_round(statistics.median(host)),) if host else (),
            work=work,
            **{
                name: _rounded(() if v is None else (v,), test_id, name, zero=name in waits)
                for name, v in (times | waits).items()
            },
        )

    def following(self, previous: BaselineEntry) -> BaselineEntry:
        """This entry with `previous`'s run history before its own median (RUN_HISTORY kept)."""
        histories = {name: getattr(previous, name) for name in ("run_medians", *_HISTORIES)}
        histories |= {name: getattr(previous, name) for name in _RUN_RECORDS}
        before = {**histories, "run_medians": previous.run_medians or (previous.median,)}
        if previous == replace(self, **histories):  # the same run saved again: no new run
            return replace(self, **before)
        # A run without a bare model (or host loop, ...) breaks that history: no spread across
        # gaps.
        mine = {name: getattr(self, name) for name in _HISTORIES}
        mine |= {"run_medians": (self.median,), "run_recorded_at": (self.recorded_at,)}
        mine["run_commits"] = (self.commit,)
        return replace(
            self,
            **{
                name: (*before[name], own[-1])[-RUN_HISTORY:] if own else ()
                for name, own in mine.items()
            },
        )

    def to_dict(self) -> dict[str, Any]:
        """The entry as plain JSON; the work left out when it was not counted."""
        row = {f.name: json_value(getattr(self, f.name)) for f in fields(self) if f.name != "work"}
        return row | ({} if self.work is None else {"work": self.work.to_json()})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineEntry:
        """Inverse of :meth:`to_dict`; raises ValueError naming the first problem found."""
        data = json_object(data, "baseline entry")
        missing = sorted(_ENTRY_FIELDS - data.keys())
        unknown = sorted(data.keys() - _ENTRY_FIELDS - _OPTIONAL_ENTRY_FIELDS)
        if missing or unknown:
            raise ValueError(f"entry fields: missing {missing}, unknown {unknown}")
        work = data.get("work")
        if work is not None:
            work = Work.from_json(work, f"baseline entry {data.get('test_id')!r}: work")
        scalars = ("test_id", "median", "dispersion", "stdev", "n", "peak_memory_bytes")
        return cls(
            **{name: data[name] for name in (*scalars, "recorded_at", "commit")},
            samples=tuple(get_field(data, "samples", list)),
            versions=get_field(data, "versions", Mapping),
            extra=get_field(data, "extra", Mapping),
            work=work,
            **{name: tuple(get_field(data, name, list)) for name in _LIST_FIELDS},
            **{name: tuple(get_field(data, name, list, default=[])) for name in _RUN_RECORDS},
        )


# What every file's entry holds: the rest came with later schemas.
_ENTRY_FIELDS = frozenset(f.name for f in fields(BaselineEntry)) - _OPTIONAL_ENTRY_FIELDS


def relative_spread(samples: Iterable[float]) -> float:
    """Robust relative spread: 1.4826 * MAD / median (a CV that ignores a single outlier)."""
    from scipy.stats import median_abs_deviation  # lazy: scipy.stats is slow to import

    values = list(samples)
    return MAD_TO_SIGMA * float(median_abs_deviation(values)) / statistics.median(values)


def checked_numbers(
    values: Iterable[object], where: str, name: str, zero: bool = False
) -> tuple[float, ...]:
    """As floats; ValueError naming the first that is no finite positive (or `zero`) number."""
    result = []
    for value in values:
        # numbers.Real admits numpy scalars but not strings, which float() would accept.
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and value >= 0 and (zero or value)):
            kind = "non-negative" if zero else "positive"
            raise ValueError(f"{where}: {name} must be {kind} numbers, got {value!r}")
        result.append(float(value))  # type: ignore[arg-type]
    return tuple(result)


def _rounded(
    values: Iterable[float], test_id: str, name: str, zero: bool = False
) -> tuple[float, ...]:
    return tuple(_round(v) for v in checked_numbers(values, test_id, name, zero))


def _round(value: float) -> float:
    return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")


def _parse_timestamp(value: object, test_id: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{test_id}: recorded_at must be an ISO 8601 string")
    try:
        # Python 3.10's fromisoformat does not read a trailing "Z"; hand edits may use it.
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError as exc:
        raise ValueError(f"{test_id}: recorded_at {value!r} is not ISO 8601") from exc
    if parsed.tzinfo is None:
        raise ValueError(f"{test_id}: recorded_at {value!r} has no time zone (expected UTC)")
