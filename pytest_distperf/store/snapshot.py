"""Every baseline file of a directory, or of one at a commit (``REF:DIR``, through `git show`),
for `distperf baselines`: the entries by topology key, and each unreadable file's problem."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from pytest_distperf.gitinfo import GIT_TIMEOUT_S
from pytest_distperf.store.entry import BaselineEntry
from pytest_distperf.store.store import (
    BaselineFileError,
    BaselineStore,
    read_document,
    validate_topology_key,
)


class SnapshotError(ValueError):
    """The directory or the commit cannot be read at all; the message names it."""


@dataclass(frozen=True)
class Snapshot:
    source: str  # the directory, or REF:DIR, as given
    entries: dict[str, dict[str, BaselineEntry]]  # topology key -> test id -> entry
    unreadable: tuple[BaselineFileError, ...] = ()
    notes: tuple[str, ...] = ()


def read_directory(directory: str | Path) -> Snapshot:
    """The baseline files of `directory`; SnapshotError when it is not a directory."""
    store = BaselineStore(directory)
    if not store.directory.is_dir():
        raise SnapshotError(f"{directory}: no such baseline directory")
    entries, unreadable, topology_keys = {}, [], store.keys()
    for key in topology_keys:
        try:
            entries[key] = store.load(key)
        except BaselineFileError as error:
            unreadable.append(error)
    return Snapshot(str(directory), entries, tuple(unreadable))


def read_source(source: str) -> Snapshot:
    """A directory when one exists at `source`, else ``REF:DIR`` read from git."""
    if Path(source).is_dir() or ":" not in source:
        return read_directory(source)
    ref, _, directory = source.partition(":")
    return read_commit(ref, directory.rstrip("/"))


def read_commit(ref: str, directory: str) -> Snapshot:
    """The baseline files of `directory` (from the repository's root, or ``./DIR`` from the
    working directory) at commit `ref`; none there yet: no entries, and a note saying so."""
    source = f"{ref}:{directory}"
    try:
        _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except SnapshotError:
        raise SnapshotError(f"{source}: {ref!r} is not a commit of the repository here") from None
    try:
        listing = _git("ls-tree", "-z", source).decode("utf-8", "replace")
    except SnapshotError:  # the commit has no such directory: every entry is new
        return Snapshot(source, {}, (), (f"{source}: no such directory at {ref}",))
    entries, unreadable = {}, []
    for line in filter(None, listing.split("\0")):
        meta, _, name = line.partition("\t")
        if meta.split()[1:2] != ["blob"] or not name.endswith(".json"):
            continue
        key = name[: -len(".json")]
        try:
            validate_topology_key(key)
        except ValueError:
            continue  # what BaselineStore.keys() skips on a disk too
        try:
            raw = _git("show", f"{source}/{name}")
            entries[key] = read_document(Path(f"{source}/{name}"), raw, key)[1]
        except BaselineFileError as error:
            unreadable.append(error)
    return Snapshot(source, entries, tuple(unreadable))


def _git(*args: str) -> bytes:
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SnapshotError(f"git {' '.join(args)}: {error}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip()
        raise SnapshotError(f"git {' '.join(args)}: {message or f'exit {done.returncode}'}")
    return done.stdout
