"""How a failed or hung run reads to the user, whichever launcher started its ranks."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pytest_distperf.spec import RunSpec

OUTPUT_TAIL_LINES = 60


class RunFailed(Exception):
    """One or more ranks failed or hung; the message is meant for the user as is."""


def where(spec: RunSpec) -> str:
    return f"[{spec.strategy}, {spec.devices} {spec.accelerator} ranks, {spec.test_id}]"


def timeout_headline(spec: RunSpec) -> str:
    return (
        f"distperf: ranks still running after --distperf-timeout={spec.timeout:g} s were "
        f"stopped {where(spec)}; stack dumps of the hung ranks follow."
    )


def start_timeout_headline(spec: RunSpec, seconds: float) -> str:
    return (
        f"distperf: the rank pool did not start within {seconds:g} s (process start, imports, "
        f"process group) {where(spec)}; each rank's output follows."
    )


def failed_headline(spec: RunSpec, ranks: Iterable[int], elapsed: float) -> str:
    listed = ", ".join(str(r) for r in sorted(ranks))
    return f"distperf: rank {listed} of {spec.devices} failed after {elapsed:.1f} s {where(spec)}"


def rank_section(rank: int, status: str, body: str) -> str:
    return f"\n--- rank {rank} ({status}) ---\n{body.rstrip() or '(no output captured)'}"


def output_tail(path: Path, lines: int = OUTPUT_TAIL_LINES, start: int = 0) -> str:
    """The last `lines` lines a rank wrote to `path` from byte `start` on ('' if none)."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
