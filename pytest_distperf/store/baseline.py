"""Baseline store: one reviewable JSON file per topology key, merged under a file lock.

Layout: ``<directory>/<topology_key>.json`` holding
``{"schema": 4, "topology_key": ..., "topology": {...}, "entries": {test_id: entry, ...}}``.
Files are written sorted and indented so that a baseline update reads as a small diff in review.

Concurrency: readers take no lock, because writers replace the file atomically (temp file in the
same directory, fsync, ``os.replace``, fsync of the directory), so a reader sees the old or the new
file and never half of one. Writers serialize on ``<file>.lock`` (``filelock.FileLock``, an
``flock`` on POSIX that the kernel drops when the holder dies, so a killed writer leaves no stale
lock) and merge: each re-reads the file inside the lock and replaces only its own test ids, so
parallel CI jobs (or pytest-xdist workers) sharing a baseline directory do not lose each other's
entries. Add ``*.lock`` to the baseline directory's ``.gitignore``.

A file that cannot be read (truncated, not JSON, unknown schema, wrong shape) raises
:class:`BaselineFileError` and is never overwritten: it may hold reviewed numbers that a person
should repair, not a test run.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

import filelock

from pytest_distperf.judge.stats import relative_spread
from pytest_distperf.store.files import atomic_write_text

# 2 added run_medians, 3 the relative speed, 4 the host's own speed; older files are read
# (without them), written as 4
SCHEMA = 4
READABLE_SCHEMAS = (1, 2, 3, 4)
# Recorded runs kept per test: enough for a robust spread, few enough that a deliberate change
# of speed leaves the window (the spread is interquartile, so a change in under a quarter of
# the window is ignored, and one in more widens the tolerance until it leaves).
RUN_HISTORY = 10

# Conservative on purpose: keys become file names on every OS a runner may use and appear in
# shell commands and CI logs. 200 leaves room for ".json.lock" and the temp-file affixes.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
_FILE_FIELDS = frozenset({"schema", "topology_key", "topology", "entries"})
_ENTRY_FIELDS = frozenset(
    {
        "test_id",
        "samples",
        "median",
        "dispersion",
        "stdev",
        "n",
        "peak_memory_bytes",
        "recorded_at",
        "commit",
        "versions",
        "extra",
    }
)
# Absent from older files: run_medians before schema 2, the relative speed before schema 3,
# the host loop before schema 4.
_LIST_FIELDS = ("run_medians", "relative_samples", "relative_run_medians", "host_loop_run_medians")
_OPTIONAL_ENTRY_FIELDS = frozenset(_LIST_FIELDS)
# Throughput noise is percent-level; six significant digits keep the file's diffs short while
# losing nothing that a comparison could see.
_SIGNIFICANT_DIGITS = 6


class BaselineFileError(ValueError):
    """A baseline file exists but cannot be used; the message names the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"baseline file {path}: {problem}")
        self.path = path
        self.problem = problem


def validate_topology_key(topology_key: str) -> str:
    """Return ``topology_key`` if it is safe as a file name, else raise ValueError saying why."""
    if not isinstance(topology_key, str):
        raise ValueError(f"topology key must be a string, got {topology_key!r}")
    if "/" in topology_key or "\\" in topology_key or ".." in topology_key:
        raise ValueError(
            f"topology key {topology_key!r} must not contain path separators or '..': it is "
            "used as a file name in the baseline directory"
        )
    if not _KEY_PATTERN.fullmatch(topology_key):
        raise ValueError(
            f"topology key {topology_key!r} is not a safe file name: use 1-200 characters from "
            "A-Z a-z 0-9 . _ + - starting with a letter or digit"
        )
    return topology_key


def validate_test_id(test_id: str) -> str:
    """Return ``test_id`` if usable as an entry key (non-empty, one line), else raise ValueError."""
    if not isinstance(test_id, str) or not test_id.strip():
        raise ValueError(f"test id must be a non-empty string, got {test_id!r}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in test_id):
        raise ValueError(f"test id {test_id!r} contains control characters")
    return test_id


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

    @property
    def relative_median(self) -> float | None:
        return statistics.median(self.relative_samples) if self.relative_samples else None

    def __post_init__(self) -> None:
        validate_test_id(self.test_id)
        samples = tuple(self.samples)
        if not samples:
            raise ValueError(f"{self.test_id}: no samples")
        for value in samples:
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{self.test_id}: samples must be positive numbers, got {value!r}")
        if not _is_count(self.n) or self.n != len(samples):
            raise ValueError(f"{self.test_id}: n={self.n!r} but there are {len(samples)} samples")
        median = statistics.median(samples)
        if not _is_number(self.median) or not math.isclose(self.median, median, rel_tol=1e-5):
            raise ValueError(
                f"{self.test_id}: median {self.median!r} does not match the samples' median "
                f"{median!r}"
            )
        for name in ("dispersion", "stdev"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.test_id}: {name} must be a non-negative number")
        memory = self.peak_memory_bytes
        if memory is not None and not _is_count(memory):
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
        try:
            # A JSON round trip both rejects what save() could not write (fail at creation, not in
            # a later save) and deep-copies, so the caller's dict cannot change the entry.
            extra = json.loads(json.dumps(dict(self.extra), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self.test_id}: extra must be JSON-serializable ({exc})") from exc
        for name in _LIST_FIELDS:
            values = tuple(getattr(self, name))
            for value in values:
                if not _is_number(value) or not math.isfinite(value) or value <= 0:
                    raise ValueError(
                        f"{self.test_id}: {name} must be positive numbers, got {value!r}"
                    )
            object.__setattr__(self, name, tuple(float(v) for v in values))
        object.__setattr__(self, "samples", tuple(float(v) for v in samples))
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
    ) -> BaselineEntry:
        """Build an entry from raw tokens/sec repeats (and the relative speed and host loop
        time of each, when known), computing the summary statistics."""
        rounded = _rounded_samples(samples, test_id, "samples")
        if not rounded:
            raise ValueError(f"{test_id}: no samples")
        relative = _rounded_samples(relative_samples, test_id, "relative_samples")
        host = _rounded_samples(host_loop_samples, test_id, "host_loop_samples")
        when = datetime.now(timezone.utc) if now is None else now
        if when.tzinfo is None:
            raise ValueError("now must be timezone-aware (baselines record UTC)")
        return cls(
            test_id=test_id,
            samples=rounded,
            median=_round(statistics.median(rounded)),
            dispersion=_round(relative_spread(rounded)),
            stdev=_round(statistics.stdev(rounded)) if len(rounded) > 1 else 0.0,
            n=len(rounded),
            peak_memory_bytes=peak_memory_bytes,
            recorded_at=when.astimezone(timezone.utc).isoformat(timespec="seconds"),
            commit=commit,
            versions=dict(versions),
            extra=dict(extra or {}),
            run_medians=(_round(statistics.median(rounded)),),
            relative_samples=relative,
            relative_run_medians=(_round(statistics.median(relative)),) if relative else (),
            host_loop_run_medians=(_round(statistics.median(host)),) if host else (),
        )

    def following(self, previous: BaselineEntry) -> BaselineEntry:
        """This entry with `previous`'s run history before its own median (RUN_HISTORY kept)."""
        earlier = previous.run_medians or (previous.median,)
        earlier_relative = previous.relative_run_medians
        if not earlier_relative and previous.relative_median is not None:
            earlier_relative = (previous.relative_median,)
        histories = {
            "run_medians": previous.run_medians,
            "relative_run_medians": previous.relative_run_medians,
            "host_loop_run_medians": previous.host_loop_run_medians,
        }
        if previous == replace(self, **histories):  # the same run saved again: no new run
            return replace(
                self,
                run_medians=earlier,
                relative_run_medians=earlier_relative,
                host_loop_run_medians=previous.host_loop_run_medians,
            )
        return replace(
            self,
            run_medians=(*earlier, self.median)[-RUN_HISTORY:],
            # A run without a bare model (or host loop) breaks that history: no spread across gaps.
            relative_run_medians=_extended(earlier_relative, self.relative_run_medians),
            host_loop_run_medians=_extended(
                previous.host_loop_run_medians, self.host_loop_run_medians
            ),
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
            "run_medians": list(self.run_medians),
            "relative_samples": list(self.relative_samples),
            "relative_run_medians": list(self.relative_run_medians),
            "host_loop_run_medians": list(self.host_loop_run_medians),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BaselineEntry:
        """Inverse of :meth:`to_dict`; raises ValueError naming the first problem found."""
        if not isinstance(data, Mapping):
            raise ValueError(f"an entry must be a JSON object, got {type(data).__name__}")
        missing = sorted(_ENTRY_FIELDS - data.keys())
        unknown = sorted(data.keys() - _ENTRY_FIELDS - _OPTIONAL_ENTRY_FIELDS)
        if missing or unknown:
            raise ValueError(f"entry fields: missing {missing}, unknown {unknown}")
        samples = data["samples"]
        if not isinstance(samples, list):
            raise ValueError("samples must be a list of numbers")
        for name in ("versions", "extra"):
            if not isinstance(data[name], Mapping):
                raise ValueError(f"{name} must be a JSON object")
        lists = {}
        for name in _LIST_FIELDS:
            lists[name] = data.get(name, [])
            if not isinstance(lists[name], list):
                raise ValueError(f"{name} must be a list of numbers")
        return cls(
            test_id=data["test_id"],
            samples=tuple(samples),
            median=data["median"],
            dispersion=data["dispersion"],
            stdev=data["stdev"],
            n=data["n"],
            peak_memory_bytes=data["peak_memory_bytes"],
            recorded_at=data["recorded_at"],
            commit=data["commit"],
            versions=data["versions"],
            extra=data["extra"],
            run_medians=tuple(lists["run_medians"]),
            relative_samples=tuple(lists["relative_samples"]),
            relative_run_medians=tuple(lists["relative_run_medians"]),
            host_loop_run_medians=tuple(lists["host_loop_run_medians"]),
        )


def _extended(history: tuple[float, ...], own: tuple[float, ...]) -> tuple[float, ...]:
    """This run's median (the last of `own`) after `history`, RUN_HISTORY kept; nothing when
    this run has none."""
    return (*history, own[-1])[-RUN_HISTORY:] if own else ()


def _rounded_samples(values: Iterable[float], test_id: str, name: str) -> tuple[float, ...]:
    result = []
    for value in values:
        # numbers.Real admits numpy scalars but not strings, which float() would accept.
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{test_id}: {name} must be numbers, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{test_id}: {name} must be positive numbers, got {value!r}")
        result.append(_round(float(value)))
    return tuple(result)


class BaselineStore:
    """Baselines in ``directory``, one JSON file per topology key (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, lock_timeout: float = 60.0) -> None:
        self.directory = Path(directory)
        # A writer holds the lock for one read + write of a small file: a minute of waiting means
        # something is wrong (a hung process, a lock on a network filesystem), not contention.
        self.lock_timeout = lock_timeout

    def __repr__(self) -> str:
        return f"BaselineStore({str(self.directory)!r})"

    def path(self, topology_key: str) -> Path:
        return self.directory / f"{validate_topology_key(topology_key)}.json"

    def keys(self) -> list[str]:
        """Topology keys that have a baseline file, sorted (for "keys that exist: ...")."""
        if not self.directory.is_dir():
            return []
        return sorted(
            p.stem
            for p in self.directory.iterdir()
            if p.suffix == ".json"
            and _KEY_PATTERN.fullmatch(p.stem)
            and ".." not in p.stem
            and p.is_file()
        )

    def load(self, topology_key: str) -> dict[str, BaselineEntry]:
        """All entries for ``topology_key``; empty when there is no file yet."""
        document = self._read(self.path(topology_key), topology_key)
        return {} if document is None else document[1]

    def topology(self, topology_key: str) -> dict[str, Any] | None:
        """The stored description of the topology, or None when there is no file yet."""
        document = self._read(self.path(topology_key), topology_key)
        return None if document is None else document[0]

    def get(self, topology_key: str, test_id: str) -> BaselineEntry | None:
        return self.load(topology_key).get(test_id)

    def save(
        self,
        topology_key: str,
        entries: Mapping[str, BaselineEntry],
        topology: Mapping[str, Any] | None = None,
        *,
        keep_history: bool = True,
    ) -> Path:
        """Merge ``entries`` into the file for ``topology_key``; other test ids are kept.

        With ``keep_history`` an entry that replaces a stored one carries the stored entry's run
        medians before its own (`BaselineEntry.following`).

        ``topology`` replaces the stored description when given. Raises BaselineFileError (and
        leaves the file byte-identical) when the existing file is unreadable, and TimeoutError
        when the lock is not acquired within ``lock_timeout`` seconds.
        """
        path = self.path(topology_key)
        updates = dict(entries)
        for test_id, entry in updates.items():
            if not isinstance(entry, BaselineEntry):
                raise TypeError(
                    f"{test_id!r}: expected a BaselineEntry, got {type(entry).__name__}"
                )
            if test_id != entry.test_id:
                raise ValueError(f"entry stored under {test_id!r} has test_id {entry.test_id!r}")
        new_topology: dict[str, Any] | None = None
        if topology is not None:
            try:
                new_topology = json.loads(json.dumps(dict(topology), allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"topology must be JSON-serializable ({exc})") from exc

        self.directory.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(f"{path}.lock", timeout=self.lock_timeout)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise TimeoutError(
                f"could not lock {path} within {self.lock_timeout:g} s: another writer holds "
                f"{path}.lock"
            ) from exc
        try:
            _remove_orphaned_temps(path)
            try:
                raw: bytes | None = path.read_bytes()
            except FileNotFoundError:
                raw = None
            # Parsing inside the lock is what makes this a merge rather than last-writer-wins;
            # an unreadable file raises here, before anything is written.
            old_topology, merged = ({}, {}) if raw is None else _parse(path, raw, topology_key)
            if keep_history:
                # Read under the lock, so two refreshes of one test both land in its history.
                for test_id, entry in updates.items():
                    if test_id in merged:
                        updates[test_id] = entry.following(merged[test_id])
            merged.update(updates)
            text = _render(
                topology_key, old_topology if new_topology is None else new_topology, merged
            )
            if raw != text.encode("utf-8"):
                atomic_write_text(path, text, temp_prefix=_temp_prefix(path))
        finally:
            lock.release()
        return path

    @staticmethod
    def _read(
        path: Path, topology_key: str
    ) -> tuple[dict[str, Any], dict[str, BaselineEntry]] | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return _parse(path, raw, topology_key)


# --- file format -------------------------------------------------------------------------------


def _render(topology_key: str, topology: dict[str, Any], entries: dict[str, BaselineEntry]) -> str:
    document = {
        "schema": SCHEMA,
        "topology_key": topology_key,
        "topology": topology,
        "entries": {test_id: entry.to_dict() for test_id, entry in entries.items()},
    }
    return json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A hand-resolved merge conflict can leave the same test id twice; json would keep the last
    # one silently, so refuse instead.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _parse(
    path: Path, raw: bytes, topology_key: str
) -> tuple[dict[str, Any], dict[str, BaselineEntry]]:
    if not raw.strip():
        raise BaselineFileError(path, "file is empty (truncated?)")
    try:
        data = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_reject_constant
        )
    except UnicodeDecodeError as exc:
        raise BaselineFileError(path, f"not UTF-8 text ({exc})") from exc
    except _DuplicateKey as exc:
        raise BaselineFileError(path, f"key {exc} appears twice") from exc
    except ValueError as exc:  # JSONDecodeError and rejected constants
        raise BaselineFileError(path, f"not valid JSON ({exc}); truncated or conflicted?") from exc
    if not isinstance(data, dict):
        raise BaselineFileError(path, f"expected a JSON object, found {type(data).__name__}")
    if "schema" not in data:
        raise BaselineFileError(path, "no 'schema' field: not a pytest-distperf baseline file")
    if data["schema"] not in READABLE_SCHEMAS or isinstance(data["schema"], bool):
        readable = ", ".join(map(str, READABLE_SCHEMAS))
        raise BaselineFileError(
            path,
            f"unknown schema version {data['schema']!r} (this pytest-distperf reads schemas "
            f"{readable}; a newer version may have written it)",
        )
    missing = sorted(_FILE_FIELDS - data.keys())
    unknown = sorted(data.keys() - _FILE_FIELDS)
    if missing or unknown:
        raise BaselineFileError(path, f"top-level fields: missing {missing}, unknown {unknown}")
    if data["topology_key"] != topology_key:
        # A file copied or renamed by hand would otherwise compare runs across machines.
        raise BaselineFileError(
            path, f"holds topology key {data['topology_key']!r}, expected {topology_key!r}"
        )
    if not isinstance(data["topology"], dict):
        raise BaselineFileError(path, "'topology' must be a JSON object")
    if not isinstance(data["entries"], dict):
        raise BaselineFileError(path, "'entries' must be a JSON object mapping test ids to entries")
    entries: dict[str, BaselineEntry] = {}
    for test_id, item in data["entries"].items():
        try:
            entry = BaselineEntry.from_dict(item)
        except (TypeError, ValueError) as exc:
            raise BaselineFileError(path, f"entry {test_id!r}: {exc}") from exc
        if entry.test_id != test_id:
            raise BaselineFileError(path, f"entry {test_id!r} carries test_id {entry.test_id!r}")
        entries[test_id] = entry
    return data["topology"], entries


# --- atomic writes ------------------------------------------------------------------------------


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def _remove_orphaned_temps(path: Path) -> None:
    # Temp files are only created while holding the lock, so one that exists while we hold it
    # belongs to a writer that died between writing and renaming.
    for orphan in path.parent.glob(f"{_temp_prefix(path)}*.tmp"):
        orphan.unlink(missing_ok=True)


# --- small helpers ------------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
