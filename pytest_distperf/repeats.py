"""Per-repeat figures over the ranks' samples (pure; measured.RunResult's properties call these).

Each repeat is as slow as its slowest rank: the ranks advance in lock-step through collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol


class Timed(Protocol):
    total_s: float
    queued_s: float | None
    off_cpu_s: float | None


def slowest(values: Iterable[Any], largest: Callable[[list[Any]], Any] = max) -> Any:
    """The slowest rank's value, the one definition: the largest of every rank's (`largest` says
    how for a record); None when some rank has none, since that rank may have been the
    slowest."""
    known = list(values)
    return None if not known or None in known else largest(known)


def slowest_per_repeat(per_rank: Iterable[Sequence[Timed]]) -> tuple[Timed, ...]:
    per_repeat = zip(*per_rank, strict=True)
    return tuple(max(group, key=lambda s: s.total_s) for group in per_repeat)


def total(sample: Timed) -> float:
    return sample.total_s


def unqueued(sample: Timed) -> float:
    """The time without its wait for a core: what a busy neighbour cannot have added."""
    return sample.total_s - (sample.queued_s or 0.0)


def bare_over_wrapped(
    bare: Sequence[Sequence[Timed]],
    wrapped: Sequence[Sequence[Timed]],
    time: Callable[[Timed], float] = total,
) -> tuple[float, ...]:
    """Per repeat, the bare model's time over the wrapped one's (slowest rank's of each):
    0.3 = the strategy runs at 30% of the bare model's speed; empty when some rank had no
    bare model."""
    if not all(bare):
        return ()
    pairs = zip(slowest_per_repeat(bare), slowest_per_repeat(wrapped), strict=True)
    return tuple(time(b) / time(w) for b, w in pairs)


def off_cpu_shares(per_rank: Sequence[Sequence[Timed]]) -> tuple[float, ...]:
    """Per repeat, the largest share of a rank's timed generation its timing thread spent off
    the CPU by its own doing (a sleep, a sync, I/O, a lock, a peer): the rank that waited
    most; empty where some rank has no such figure."""
    if not per_rank or any(s.off_cpu_s is None for rank in per_rank for s in rank):
        return ()
    return tuple(
        max((s.off_cpu_s or 0.0) / s.total_s for s in repeat)
        for repeat in zip(*per_rank, strict=True)
    )


def slowest_phases(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Seconds of each phase of a test, the slowest rank's (RankResult.phase_s); {} where some
    rank reported none."""
    if not per_rank or not all(per_rank):
        return {}
    names = dict.fromkeys(name for phases in per_rank for name in phases)
    return {name: max(phases.get(name, 0.0) for phases in per_rank) for name in names}


def slowest_per_repeat_of(per_rank: Sequence[Sequence[float]], repeats: int) -> tuple[float, ...]:
    """Per repeat, the largest of the ranks' values; empty when some rank has not one per
    repeat."""
    if not all(len(values) == repeats for values in per_rank):
        return ()
    return tuple(max(values) for values in zip(*per_rank, strict=True))
