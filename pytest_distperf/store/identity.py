"""Where a baseline's test identity starts: the repository that holds the test file, not the
directory pytest happened to pick as its rootdir.

pytest's node id is relative to the rootdir, which moves with the invocation (the arguments,
an existing path among them, an ini file). The identity uses the test file's path relative to
the nearest enclosing git work tree instead (walking up for ``.git``, a directory or a
worktree's file), so `pytest perf/` from the repository, `pytest .` inside `perf/` and another
checkout all name a test alike; outside git it stays the rootdir-relative node id. An identity
reads ``<node id> [<workload>]`` (judge/gate.py builds it). Pure: file-system reads only.
"""

from __future__ import annotations

import os
from pathlib import Path

SEPARATOR = "::"  # between a node id's file and the rest (class, function, parameters)
WORKLOAD_OPENER = " ["  # between an identity's node id and its workload


def repository_root(directory: Path) -> Path | None:
    """The nearest directory at or above `directory` that holds ``.git``, or None."""
    for candidate in (directory, *directory.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def repository_nodeid(nodeid: str, rootpath: str | os.PathLike[str]) -> str:
    """`nodeid` (relative to `rootpath`) with its file part made relative to the git work tree
    that holds the file; `nodeid` itself when there is none, or the file is not under it."""
    file_part, sep, rest = nodeid.partition(SEPARATOR)
    # normpath, not resolve(): a symlinked checkout keeps its own name for both paths.
    path = Path(os.path.normpath(Path(os.path.abspath(rootpath)) / file_part))
    root = repository_root(path.parent)
    if root is None:
        return nodeid
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        return nodeid
    return f"{relative}{sep}{rest}"


def split_identity(test_id: str) -> tuple[str, str]:
    """(node id, workload) of an identity; the workload is "" when it has none."""
    head, sep, tail = test_id.rpartition(WORKLOAD_OPENER)
    if not sep or not tail.endswith("]"):
        return test_id, ""
    return head, tail[:-1]


def file_of(nodeid: str) -> str:
    """The file part of a node id (or of an identity)."""
    return nodeid.partition(SEPARATOR)[0]


def name_in_file(nodeid: str) -> str:
    """What follows the file in a node id: ``test_decode[auto-1cuda]``, ``Class::test``."""
    return nodeid.partition(SEPARATOR)[2]
