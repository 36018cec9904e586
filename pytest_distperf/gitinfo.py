"""Asking git about the checkout: every call bounded in time, so a hung git (a network mount, a
credential prompt) never stalls a session. Standard library only."""

from __future__ import annotations

import os
import subprocess

GIT_TIMEOUT_S = 5.0


def git(cwd: str | os.PathLike[str], *args: str) -> str:
    """`git ARGS` in `cwd`, its stripped output; OSError without git, CalledProcessError or
    TimeoutExpired when it fails or hangs."""
    completed = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=True,
    )
    return completed.stdout.strip()


def current_commit(cwd: str | os.PathLike[str]) -> str | None:
    """The commit checked out in `cwd`, or None outside git (or without a commit, or git)."""
    try:
        return git(cwd, "rev-parse", "HEAD") or None
    except (OSError, subprocess.SubprocessError):
        return None
