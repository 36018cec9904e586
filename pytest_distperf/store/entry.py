"""A baseline entry: the stored measurement of one test on one topology, its schema and its
validation. Pure: no I/O (the store reads and writes the files, store.py).

An entry is checked whole when it is made, from samples or from a file, so that whatever the
store later writes is a file it can read back; one that a person edited into something else
raises ValueError naming the first problem.
"""

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

from pytest_distperf.jsonfields import get_field, is_count, is_number, json_object
from pytest_distperf.store.spread import relative_spread
from pytest_distperf.work import Work

# One schema: a file of any other is refused, naming it (record the baselines again).
SCHEMA = 7
READABLE_SCHEMAS = (SCHEMA,)
# Recorded runs kept per test: enough for a robust spread, few enough that a deliberate change
# of speed leaves the window (the spread is interquartile, so a change in under a quarter of
# the window is ignored, and one in more widens the tolerance until it leaves).
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
# What `_rounded` holds a list's values to, as its message says it.
_POSITIVE, _NON_NEGATIVE_NUMBERS = "positive numbers", "non-negative numbers"
_NON_NEGATIVE = frozenset(_WAIT_FIELDS)  # zero is a value (no wait at all), not a missing one
# Throughput noise is percent-level; six significant digits keep the file's diffs short while
# losing nothing that a comparison could see.
_SIGNIFICANT_DIGITS = 6


@dataclass(frozen=True)
class BaselineEntry:
    """The stored measurement of one test on one topology."""

    #: Identity of the measurement: node id + strategy + devices + workload (built by the caller).
    test_id: str
    #: Tokens/sec of each repeat, in the order measured. The source of truth; the rest summarizes.
    samples: tuple[float, ...]
    median: float
    #: Robust relative spread, 1.4826 * MAD / median (a coefficient of variation that one wild
    #: repeat cannot inflate); what the default tolerance is derived from.
    dispersion: float
    #: Sample standard deviation in tokens/sec (0 for a single sample), for readers used to it.
    stdev: float
    n: int
    peak_memory_bytes: int | None
    #: ISO 8601 UTC time of the measurement.
    recorded_at: str
    commit: str | None = None
    # Mappings are frozen into read-only views in __post_init__ and left out of the hash, so an
    # entry stays immutable and hashable while reading like a dict.
    versions: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Free-form JSON data (e.g. the predicted bound and its bounding term).
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)
    #: Medians of the last RUN_HISTORY runs recorded for this test on this topology, oldest
    #: first, this entry's own last: how much whole runs drift, which the repeats cannot show.
    run_medians: tuple[float, ...] = ()
    #: Speed relative to the bare model timed beside each repeat (results.RunResult), and the
    #: medians of the last RUN_HISTORY recorded runs of it; empty when the run had no bare model.
    relative_samples: tuple[float, ...] = ()
    relative_run_medians: tuple[float, ...] = ()
    #: Median seconds of the host-speed loop (hostspeed.py) timed beside the repeats of each of
    #: the last RUN_HISTORY recorded runs: how fast the machine itself was; empty if unknown.
    host_loop_run_medians: tuple[float, ...] = ()
    #: The counted work of the latest recorded run (work.py); None when it was not counted.
    work: Work | None = None
    #: Process CPU time per new token (the slowest rank's) and, on CUDA, summed kernel time per
    #: decode token, of each of the last RUN_HISTORY recorded runs; empty if unknown.
    host_cpu_run_medians: tuple[float, ...] = ()
    device_time_run_medians: tuple[float, ...] = ()
    #: Per new token, of the same runs: the slowest rank's wait for a core (run queue) and the
    #: host's steal per CPU; zero is a level (an idle machine), empty unknown. What a later run
    #: waited beyond them is the outside's (judge/busy.py).
    run_queue_wait_run_medians: tuple[float, ...] = ()
    steal_run_medians: tuple[float, ...] = ()
    #: Of the same runs, the largest share of a rank's generation time spent off the CPU by its
    #: own doing (measured.off_cpu_shares, median): what its waits were (judge/waits.py).
    off_cpu_share_run_medians: tuple[float, ...] = ()
    #: When, and at which commit (None: unknown), each recorded run of `run_medians` was made,
    #: oldest first.
    run_recorded_at: tuple[str, ...] = ()
    run_commits: tuple[str | None, ...] = ()

    @property
    def relative_median(self) -> float | None:
        return statistics.median(self.relative_samples) if self.relative_samples else None

    def __post_init__(self) -> None:
        test_id = self.test_id  # an entry's key: a non-empty string of one line
        if not isinstance(test_id, str) or not test_id.strip():
            raise ValueError(f"test id must be a non-empty string, got {test_id!r}")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in test_id):
            raise ValueError(f"test id {test_id!r} contains control characters")
        samples = tuple(self.samples)
        if not samples:
            raise ValueError(f"{self.test_id}: no samples")
        for value in samples:
            if not is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{self.test_id}: samples must be positive numbers, got {value!r}")
        if not is_count(self.n) or self.n != len(samples):
            raise ValueError(f"{self.test_id}: n={self.n!r} but there are {len(samples)} samples")
        median = statistics.median(samples)
        if not is_number(self.median) or not math.isclose(self.median, median, rel_tol=1e-5):
            raise ValueError(
                f"{self.test_id}: median {self.median!r} does not match the samples' median "
                f"{median!r}"
            )
        for name in ("dispersion", "stdev"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.test_id}: {name} must be a non-negative number")
        memory = self.peak_memory_bytes
        if memory is not None and not is_count(memory):
            raise ValueError(
                f"{self.test_id}: peak_memory_bytes must be a non-negative int or None"
            )
        _parse_timestamp(self.recorded_at, self.test_id)
        if self.commit is not None and not isinstance(self.commit, str):
            raise ValueError(f"{self.test_id}: commit must be a string or None")
        if not isinstance(self.versions, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.versions.items()
        ):
            raise ValueError(f"{self.test_id}: versions must map package names to version strings")
        if not isinstance(self.extra, Mapping):
            raise ValueError(f"{self.test_id}: extra must be a mapping")
        if self.work is not None and not isinstance(self.work, Work):
            raise ValueError(f"{self.test_id}: work must be a Work or None")
        try:
            # A JSON round trip both rejects what save() could not write (fail at creation, not in
            # a later save) and deep-copies, so the caller's dict cannot change the entry.
            extra = json.loads(json.dumps(dict(self.extra), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.test_id}: extra must be JSON-serializable ({exc})") from exc
        for name in _LIST_FIELDS:
            values = tuple(getattr(self, name))
            low = 0.0 if name in _NON_NEGATIVE else math.ulp(0.0)
            for value in values:
                if not is_number(value) or not math.isfinite(value) or value < low:
                    kind = "non-negative" if low == 0 else "positive"
                    raise ValueError(
                        f"{self.test_id}: {name} must be {kind} numbers, got {value!r}"
                    )
            object.__setattr__(self, name, tuple(float(v) for v in values))
        self._check_run_records()
        object.__setattr__(self, "samples", tuple(float(v) for v in samples))
        object.__setattr__(self, "versions", MappingProxyType(dict(sorted(self.versions.items()))))
        object.__setattr__(self, "extra", MappingProxyType(extra))

    def _check_run_records(self) -> None:
        dates, commits = tuple(self.run_recorded_at), tuple(self.run_commits)
        runs = max(len(self.run_medians), 1)
        for name, values in (("run_recorded_at", dates), ("run_commits", commits)):
            if len(values) > runs:
                raise ValueError(
                    f"{self.test_id}: {name} has {len(values)} values for {runs} recorded runs"
                )
        for value in dates:
            _parse_timestamp(value, self.test_id)
        for value in commits:
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{self.test_id}: run_commits must be strings or null")
        object.__setattr__(self, "run_recorded_at", dates)
        object.__setattr__(self, "run_commits", commits)

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
        """Build an entry from raw tokens/sec repeats (and the relative speed and host loop
        time of each, when known, and the run's counted work and per-token times), computing
        the summary statistics."""
        rounded = _rounded(samples, test_id, "samples")
        if not rounded:
            raise ValueError(f"{test_id}: no samples")
        relative = _rounded(relative_samples, test_id, "relative_samples")
        host = _rounded(host_loop_samples, test_id, "host_loop_samples")
        when = datetime.now(timezone.utc) if now is None else now
        if when.tzinfo is None:
            raise ValueError("now must be timezone-aware (baselines record UTC)")
        recorded_at = when.astimezone(timezone.utc).isoformat(timespec="seconds")
        return cls(
            test_id=test_id,
            samples=rounded,
            median=_round(statistics.median(rounded)),
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
            run_medians=(_round(statistics.median(rounded)),),
            relative_samples=relative,
            relative_run_medians=(_round(statistics.median(relative)),) if relative else (),
            host_loop_run_medians=(_round(statistics.median(host)),) if host else (),
            work=work,
            host_cpu_run_medians=_one_run(host_cpu_per_token_s, test_id, "host_cpu_per_token_s"),
            device_time_run_medians=_one_run(
                device_time_per_token_s, test_id, "device_time_per_token_s"
            ),
            **{name: _one_wait(value, test_id, name) for name, value in (waits or {}).items()},
        )

    def following(self, previous: BaselineEntry) -> BaselineEntry:
        """This entry with `previous`'s run history before its own median (RUN_HISTORY kept)."""
        earlier = previous.run_medians or (previous.median,)
        earlier_relative = previous.relative_run_medians
        if not earlier_relative and previous.relative_median is not None:
            earlier_relative = (previous.relative_median,)
        kept = ("run_medians", *_HISTORIES, *_RUN_RECORDS)
        histories = {name: getattr(previous, name) for name in kept}
        before = {**histories, "run_medians": earlier, "relative_run_medians": earlier_relative}
        # A file from before schema 7 knows the date and commit of its latest run only.
        before["run_recorded_at"] = previous.run_recorded_at or (previous.recorded_at,)
        before["run_commits"] = previous.run_commits or (previous.commit,)
        if previous == replace(self, **histories):  # the same run saved again: no new run
            return replace(self, **before)
        # A run without a bare model (or host loop, ...) breaks that history: no spread across
        # gaps.
        extended = {name: _extended(before[name], getattr(self, name)) for name in _HISTORIES}
        return replace(
            self,
            **extended,
            run_medians=(*earlier, self.median)[-RUN_HISTORY:],
            run_recorded_at=(*before["run_recorded_at"], self.recorded_at)[-RUN_HISTORY:],
            run_commits=(*before["run_commits"], self.commit)[-RUN_HISTORY:],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "test_id": self.test_id,
            "samples": list(self.samples),
            "median": self.median,
            "dispersion": self.dispersion,
            "stdev": self.stdev,
            "n": self.n,
            "peak_memory_bytes": self.peak_memory_bytes,
            "recorded_at": self.recorded_at,
            "commit": self.commit,
            "versions": dict(self.versions),
            "extra": json.loads(json.dumps(dict(self.extra))),
            **{name: list(getattr(self, name)) for name in (*_LIST_FIELDS, *_RUN_RECORDS)},
            # left out when not counted: an entry without it reads as before schema 5
            **({} if self.work is None else {"work": self.work.to_json()}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineEntry:
        """Inverse of :meth:`to_dict`; raises ValueError naming the first problem found."""
        data = json_object(data, "baseline entry")
        missing = sorted(_ENTRY_FIELDS - data.keys())
        unknown = sorted(data.keys() - _ENTRY_FIELDS - _OPTIONAL_ENTRY_FIELDS)
        if missing or unknown:
            raise ValueError(f"entry fields: missing {missing}, unknown {unknown}")
        lists = {name: get_field(data, name, list) for name in _LIST_FIELDS}
        work = data.get("work")
        if work is not None:
            work = Work.from_json(work, f"baseline entry {data.get('test_id')!r}: work")
        return cls(
            test_id=data["test_id"],
            samples=tuple(get_field(data, "samples", list)),
            median=data["median"],
            dispersion=data["dispersion"],
            stdev=data["stdev"],
            n=data["n"],
            peak_memory_bytes=data["peak_memory_bytes"],
            recorded_at=data["recorded_at"],
            commit=data["commit"],
            versions=get_field(data, "versions", Mapping),
            extra=get_field(data, "extra", Mapping),
            work=work,
            **{name: tuple(values) for name, values in lists.items()},
            **{name: tuple(get_field(data, name, list, default=[])) for name in _RUN_RECORDS},
        )


# What every file's entry holds: the rest came with later schemas.
_ENTRY_FIELDS = frozenset(f.name for f in fields(BaselineEntry)) - _OPTIONAL_ENTRY_FIELDS


def _one_run(value: float | None, test_id: str, name: str) -> tuple[float, ...]:
    """A run's one value as the start of its history; () when the run has none (a zero, as a
    profile without kernels gives, is no level to compare with either)."""
    return () if value is None or value == 0 else _rounded((value,), test_id, name)


def _one_wait(value: float | None, test_id: str, name: str) -> tuple[float, ...]:
    """A run's wait per token as the start of its history (zero included); () when unknown."""
    if name not in _WAIT_FIELDS:
        raise ValueError(f"{test_id}: {name!r} is no wait of a baseline entry ({_WAIT_FIELDS})")
    return () if value is None else _rounded((value,), test_id, name, _NON_NEGATIVE_NUMBERS)


def _extended(history: tuple[float, ...], own: tuple[float, ...]) -> tuple[float, ...]:
    """This run's median (the last of `own`) after `history`, RUN_HISTORY kept; nothing when
    this run has none."""
    return (*history, own[-1])[-RUN_HISTORY:] if own else ()


def _rounded(
    values: Iterable[float], test_id: str, name: str, kind: str = _POSITIVE
) -> tuple[float, ...]:
    """The values rounded; ValueError naming the first that is no real number of that kind."""
    result = []
    for value in values:
        # numbers.Real admits numpy scalars but not strings, which float() would accept.
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{test_id}: {name} must be numbers, got {value!r}")
        if not (value >= 0 and math.isfinite(value)) or (kind == _POSITIVE and not value):
            raise ValueError(f"{test_id}: {name} must be {kind}, got {value!r}")
        result.append(_round(float(value)))
    return tuple(result)


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
