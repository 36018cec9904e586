"""Where a baseline's test identity starts: the git work tree holding the test file (walking up
for ``.git``), not pytest's rootdir, which moves with the invocation; so `pytest perf/` from the
repository, `pytest .` inside `perf/` and another checkout name a test alike. Outside git it is
the rootdir-relative node id. An identity reads ``<node id> [<workload>]`` (judge/gate.py)."""

from __future__ import annotations

import os
from pathlib import Path

SEPARATOR = "::"  # between a node id's file and the rest (class, function, parameters)
WORKLOAD_OPENER = " ["  # between an identity's node id and its workload


def repository_nodeid(nodeid: str, rootpath: str | os.PathLike[str]) -> str:
    """`nodeid` (relative to `rootpath`) with its file part made relative to the git work tree
    that holds the file; `nodeid` itself when there is none."""
    file_part, sep, rest = nodeid.partition(SEPARATOR)
    # normpath, not resolve(): a symlinked checkout keeps its own name for both paths.
    path = Path(os.path.normpath(Path(os.path.abspath(rootpath)) / file_part))
    for root in path.parents:
        if (root / ".git").exists():
            return f"{path.relative_to(root).as_posix()}{sep}{rest}"
    return nodeid


def split_identity(test_id: str) -> tuple[str, str]:
    """(node id, workload) of an identity; the workload is "" when it has none."""
    head, sep, tail = test_id.rpartition(WORKLOAD_OPENER)
    if not sep or not tail.endswith("]"):
        return test_id, ""
    return head, tail[:-1]
