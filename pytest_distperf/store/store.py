"""Baseline store: ``<directory>/<topology_key>.json``, sorted and indented so that an update
reads as a small diff. Readers take no lock: writers replace the file atomically. Writers take
``<file>.lock`` (an ``flock`` the kernel drops when its holder dies) and re-read the file inside
it, replacing only their own test ids. An unreadable file raises BaselineFileError, untouched."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import filelock

from pytest_distperf.jsonfields import get_field
from pytest_distperf.store.entry import SCHEMA, BaselineEntry

# Keys become file names on every OS a runner may use; 200 leaves room for the affixes.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
_FILE_FIELDS = frozenset({"schema", "topology_key", "topology", "entries"})


class BaselineFileError(ValueError):
    """A baseline file exists but cannot be used; the message names the file and the problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"baseline file {path}: {problem}")
        self.path = path
        self.problem = problem


def _safe(topology_key: object) -> bool:
    return (
        isinstance(topology_key, str)
        and ".." not in topology_key
        and bool(_KEY_PATTERN.fullmatch(topology_key))
    )


def validate_topology_key(topology_key: str) -> str:
    """Return ``topology_key`` if it is safe as a file name, else raise ValueError saying why."""
    if not _safe(topology_key):
        raise ValueError(
            f"topology key {topology_key!r} is not a safe file name in the baseline directory: "
            "use 1-200 characters from A-Z a-z 0-9 . _ + - starting with a letter or digit, "
            "no '..'"
        )
    return topology_key


class BaselineStore:
    """Baselines in ``directory``, one JSON file per topology key (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], *, lock_timeout: float = 60.0) -> None:
        self.directory = Path(directory)
        # A writer holds the lock for one read + write of a small file: a minute of waiting
        # means something is wrong (a hung process, a network filesystem), not contention.
        self.lock_timeout = lock_timeout

    def path(self, topology_key: str) -> Path:
        return self.directory / f"{validate_topology_key(topology_key)}.json"

    def keys(self) -> list[str]:
        """Topology keys that have a baseline file, sorted."""
        if not self.directory.is_dir():
            return []
        paths = self.directory.iterdir()
        return sorted(
            p.stem for p in paths if p.suffix == ".json" and _safe(p.stem) and p.is_file()
        )

    def load(self, topology_key: str) -> dict[str, BaselineEntry]:
        """All entries for ``topology_key``; empty when there is no file yet."""
        path = self.path(topology_key)
        raw = _bytes(path)
        return {} if raw is None else read_document(path, raw, topology_key)[1]

    def find(self, topology_key: str, *test_ids: str) -> BaselineEntry | None:
        """The entry stored under the first of `test_ids` that has one, or None."""
        entries = self.load(topology_key)
        return next((entries[t] for t in test_ids if t in entries), None)

    def save(
        self,
        topology_key: str,
        entries: Mapping[str, BaselineEntry],
        topology: Mapping[str, Any] | None = None,
        *,
        moved_from: Mapping[str, str] | None = None,
    ) -> Path:
        """Merge ``entries`` into ``topology_key``'s file after the stored runs (`following`);
        ``moved_from``: test id -> an older id whose entry it takes over where only that is
        stored. BaselineFileError when the file is unreadable, TimeoutError without the lock."""

        def merge(merged: dict[str, BaselineEntry]) -> dict[str, BaselineEntry]:
            for test_id, older in (moved_from or {}).items():
                if test_id in entries and test_id not in merged and older in merged:
                    merged[test_id] = replace(merged.pop(older), test_id=test_id)
            for test_id, entry in entries.items():
                merged[test_id] = entry.following(merged[test_id]) if test_id in merged else entry
            return merged

        self.rewrite(topology_key, merge, topology, create=True)
        return self.path(topology_key)

    def rewrite(
        self,
        topology_key: str,
        change: Callable[[dict[str, BaselineEntry]], dict[str, BaselineEntry]],
        topology: Mapping[str, Any] | None = None,
        create: bool = False,
    ) -> dict[str, BaselineEntry]:
        """Replace ``topology_key``'s entries by ``change(entries)`` under the lock, removing a
        file left empty, and its topology by ``topology`` if given; what it holds now.
        FileNotFoundError when there is none, unless ``create``."""
        path = self.path(topology_key)
        if create:
            self.directory.mkdir(parents=True, exist_ok=True)
        with self._locked(path):
            raw = _bytes(path)
            if raw is None and not create:
                raise FileNotFoundError(f"no baseline file {path}")
            # Parsing inside the lock makes this a merge rather than last-writer-wins.
            stored, entries = ({}, {}) if raw is None else read_document(path, raw, topology_key)
            changed = change(dict(entries))
            described = stored if topology is None else dict(topology)
            if not changed:
                path.unlink(missing_ok=True)
            elif changed != entries or described != stored:
                atomic_write_text(path, _render(topology_key, described, changed))
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
            # Temp files exist only under the lock: one found now is a dead writer's.
            for orphan in path.parent.glob(f".{path.name}.*.tmp"):
                orphan.unlink(missing_ok=True)
            yield
        finally:
            lock.release()


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same directory, fsync, rename: a
    reader sees the old file or the new one, never half of either."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600: keep an existing file's mode, else 0644 for a checked-in file.
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if os.name == "posix":  # makes the rename itself durable
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return target


def _render(topology_key: str, topology: dict[str, Any], entries: dict[str, BaselineEntry]) -> str:
    for test_id, entry in entries.items():  # a file must read back
        if not isinstance(entry, BaselineEntry) or entry.test_id != test_id:
            raise ValueError(f"entry under {test_id!r} is not a BaselineEntry of that test_id")
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
    # A hand-resolved merge conflict can leave a test id twice; json would keep the last one.
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
    if data["schema"] != SCHEMA or isinstance(data["schema"], bool):
        raise BaselineFileError(
            path,
            f"unknown schema version {data['schema']!r} (this pytest-distperf reads schema "
            f"{SCHEMA} only: record the baselines again with --distperf-update-baselines, or "
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
        stored = get_field(data, "entries", dict)
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
