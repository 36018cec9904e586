"""CPU shares for CPU ranks: N ranks on a shared host must never ask for N x all cores."""

from __future__ import annotations

import os

from pytest_distperf.platform import Platform


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_threads(platform: Platform, ranks: int) -> int:
    """Threads of each rank: an equal share of the host's cores (at least one) where ranks
    share them, which N x all cores would make every rank slower; else one."""
    return max(1, available_cpus() // ranks) if platform.shares_cores else 1
