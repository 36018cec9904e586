"""The test tiers' guard: where FORBID_RANKS names a test (this project's fast tier sets it for
every test not marked `slow`), the pool and the launchers refuse to start rank processes, so a
test that would start them fails at once with a clear error instead of slowing the tier down.
Nested pytest sessions inherit the variable, and with it the refusal."""

from __future__ import annotations

import os
from collections.abc import Mapping

FORBID_RANKS = "DISTPERF_FORBID_RANKS"


def ranks_forbidden(environ: Mapping[str, str] = os.environ) -> str | None:
    """The test in which no rank may start, or None where ranks are allowed."""
    return environ.get(FORBID_RANKS) or None


def refuse_ranks(environ: Mapping[str, str] = os.environ) -> None:
    """Raise RuntimeError where rank processes are forbidden; call it right before spawning."""
    test = ranks_forbidden(environ)
    if test is not None:
        raise RuntimeError(f"rank processes are not allowed in {test}: mark it slow")
