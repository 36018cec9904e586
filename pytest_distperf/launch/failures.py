"""How a failed or hung run reads to the user, whichever launcher started its ranks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def failed_headline(spec: RunSpec, rank: int, elapsed: float) -> str:
    return f"distperf: rank {rank} of {spec.devices} failed after {elapsed:.1f} s {where(spec)}"


def rank_section(rank: int, status: str, body: str) -> str:
    return f"\n--- rank {rank} ({status}) ---\n{body.rstrip() or '(no output captured)'}"


def failure_message(
    spec: RunSpec,
    failed: Sequence[int],
    status: Callable[[int], str],
    output: Callable[[int], str],
    elapsed: float,
    timeout: str | None = None,
) -> str:
    """What a run whose ranks `failed` (in order: the first is the cause) says; past a timeout
    (`timeout`: its headline) every rank's stack matters, who waits for whom."""
    if timeout is not None:
        sections = [rank_section(rank, status(rank), output(rank)) for rank in range(spec.devices)]
        return "\n".join([timeout, *sections])
    first, *after = failed
    lines = [
        failed_headline(spec, first, elapsed),
        rank_section(first, status(first), output(first)),
    ]
    for rank in after:  # these failed because the first was gone: their last line is enough
        last = output(rank).strip().splitlines()[-1:] or [""]
        lines.append(f"\n(rank {rank} failed after it, {status(rank)}: {last[0]})")
    return "\n".join(lines)


def output_tail(path: Path, lines: int = OUTPUT_TAIL_LINES, start: int = 0) -> str:
    """The last `lines` lines a rank wrote to `path` from byte `start` on ('' if none)."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
