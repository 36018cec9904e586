"""How a failed or hung run reads to the user, whichever launcher started its ranks."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pytest_distperf.spec import RunSpec

OUTPUT_TAIL_LINES = 60


class RunFailed(Exception):
    """One or more ranks failed or hung; the message is meant for the user as is. `stops`: why
    the session must end after this test (a launched job past its timeout), or None."""

    def __init__(self, message: str, stops: str | None = None) -> None:
        super().__init__(message)
        self.stops = stops


def where(spec: RunSpec) -> str:
    return f"[{spec.strategy}, {spec.devices} {spec.accelerator} ranks, {spec.test_id}]"


def timeout_headline(spec: RunSpec) -> str:
    return (
        f"distperf: ranks still running after --distperf-timeout={spec.timeout:g} s were "
        f"stopped {where(spec)}; stack dumps of the hung ranks follow."
    )


def job_timeout_headline(spec: RunSpec) -> str:
    return (
        f"distperf: still running after --distperf-timeout={spec.timeout:g} s {where(spec)}: "
        "the job stops here; each rank wrote the stacks of its threads to its stderr (in its "
        "report of this test: captured stderr)"
    )


def job_stop_line(spec: RunSpec, rank: int | None = None) -> str:
    """Why a launched job ends at this test: its timeout, or rank `rank`'s session stopped."""
    if rank is None:
        why = f"ran past --distperf-timeout={spec.timeout:g} s"
    else:
        why = f"was stopped in rank {rank} (Ctrl-C or a signal)"
    return f"distperf: the job stops: {spec.test_id} {why}"


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
