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
should repair, not a test run. `rewrite` (the `distperf baselines` commands) holds to the same
rules, and removes a file whose last entry it removes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import filelock

from pytest_distperf.jsonfields import get_field
from pytest_distperf.store.entry import READABLE_SCHEMAS, SCHEMA, BaselineEntry
from pytest_distperf.store.files import atomic_write_text

# Conservative on purpose: keys become file names on every OS a runner may use and appear in
# shell commands and CI logs. 200 leaves room for ".json.lock" and the temp-file affixes.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
_FILE_FIELDS = frozenset({"schema", "topology_key", "topology", "entries"})


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
        return self._read(topology_key)[1]

    def topology(self, topology_key: str) -> dict[str, Any] | None:
        """The stored description of the topology, or None when there is no file yet."""
        return self._read(topology_key)[0]

    def get(self, topology_key: str, test_id: str) -> BaselineEntry | None:
        return self.load(topology_key).get(test_id)

    def find(self, topology_key: str, *test_ids: str) -> BaselineEntry | None:
        """The entry stored under the first of `test_ids` that has one (an identity, then the
        older forms of it), or None."""
        entries = self.load(topology_key)
        return next((entries[t] for t in test_ids if t in entries), None)

    def save(
        self,
        topology_key: str,
        entries: Mapping[str, BaselineEntry],
        topology: Mapping[str, Any] | None = None,
        *,
        keep_history: bool = True,
        moved_from: Mapping[str, str] | None = None,
    ) -> Path:
        """Merge ``entries`` into the file for ``topology_key``; other test ids are kept.

        With ``keep_history`` an entry that replaces a stored one carries the stored entry's run
        medians before its own (`BaselineEntry.following`). ``moved_from`` maps a test id to an
        older one: where only the older is stored, the entry takes its place and its history.

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
        with self._locked(path):
            raw = _bytes(path)
            # Parsing inside the lock is what makes this a merge rather than last-writer-wins;
            # an unreadable file raises here, before anything is written.
            old_topology, merged = ({}, {}) if raw is None else _parse(path, raw, topology_key)
            for test_id, older in (moved_from or {}).items():
                if test_id in updates and test_id not in merged and older in merged:
                    merged[test_id] = replace(merged.pop(older), test_id=test_id)
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
                atomic_write_text(path, text)
        return path

    def rewrite(
        self,
        topology_key: str,
        change: Callable[[dict[str, BaselineEntry]], dict[str, BaselineEntry]],
    ) -> dict[str, BaselineEntry]:
        """Replace the entries of ``topology_key``'s file by ``change(entries)``, read and written
        under the lock; a file left without entries is removed. Returns what it holds now.

        Raises BaselineFileError (the file left byte-identical) when it is unreadable,
        FileNotFoundError when there is none, and ValueError from ``change``.
        """
        path = self.path(topology_key)
        with self._locked(path):
            raw = _bytes(path)
            if raw is None:
                raise FileNotFoundError(f"no baseline file {path}")
            topology, entries = _parse(path, raw, topology_key)
            changed = change(dict(entries))
            for test_id, entry in changed.items():
                if test_id != entry.test_id:
                    raise ValueError(f"entry under {test_id!r} has test_id {entry.test_id!r}")
            if not changed:
                path.unlink()
            elif changed != entries:
                atomic_write_text(path, _render(topology_key, topology, changed))
        return changed

    @contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
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
            yield
        finally:
            lock.release()

    def _read(self, topology_key: str) -> tuple[dict[str, Any] | None, dict[str, BaselineEntry]]:
        """The stored topology and entries; (None, {}) when there is no file yet."""
        path = self.path(topology_key)
        raw = _bytes(path)
        return (None, {}) if raw is None else _parse(path, raw, topology_key)


# --- file format -------------------------------------------------------------------------------


def _render(topology_key: str, topology: dict[str, Any], entries: dict[str, BaselineEntry]) -> str:
    document = {
        "schema": SCHEMA,
        "topology_key": topology_key,
        "topology": topology,
        "entries": {test_id: entry.to_dict() for test_id, entry in entries.items()},
    }
    return json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


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


def read_document(
    path: Path, raw: bytes, topology_key: str
) -> tuple[dict[str, Any], dict[str, BaselineEntry]]:
    """The topology and entries of a baseline file's bytes (``path`` names it in errors: it may
    come from a commit rather than the disk); BaselineFileError when it is no such file."""
    return _parse(path, raw, topology_key)


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
            f"unknown schema version {data['schema']!r} (this pytest-distperf reads schema "
            f"{readable} only: record the baselines again with --distperf-update-baselines, or "
            "use the version that wrote it)",
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
    try:
        topology = get_field(data, "topology", dict)
        stored = get_field(data, "entries", dict)  # test ids to entries
    except ValueError as exc:
        raise BaselineFileError(path, str(exc)) from exc
    entries: dict[str, BaselineEntry] = {}
    for test_id, item in stored.items():
        try:
            entry = BaselineEntry.from_dict(item)
        except (TypeError, ValueError) as exc:
            raise BaselineFileError(path, f"entry {test_id!r}: {exc}") from exc
        if entry.test_id != test_id:
            raise BaselineFileError(path, f"entry {test_id!r} carries test_id {entry.test_id!r}")
        entries[test_id] = entry
    return topology, entries


def _remove_orphaned_temps(path: Path) -> None:
    # Temp files (atomic_write_text's) are only created while holding the lock, so one that
    # exists while we hold it belongs to a writer that died between writing and renaming.
    for orphan in path.parent.glob(f".{path.name}.*.tmp"):
        orphan.unlink(missing_ok=True)
