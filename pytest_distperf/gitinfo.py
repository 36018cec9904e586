"""Asking git for the checkout's commit, bounded in time: a hung git (a network mount, a
credential prompt) never stalls a session. Standard library only."""

from __future__ import annotations

import os
import subprocess

GIT_TIMEOUT_S = 5.0


def current_commit(cwd: str | os.PathLike[str]) -> str | None:
    """The commit checked out in `cwd`, or None outside git (or without a commit, or git)."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None
