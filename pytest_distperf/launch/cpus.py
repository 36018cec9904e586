"""CPU shares for CPU ranks: N ranks on a shared host must never ask for N x all cores."""

from __future__ import annotations

import os

from pytest_distperf.platform import Platform


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(devices: int, cpus: int | None = None) -> int:
    # Ranks share the cores: give each an equal share (at least one) so N ranks never ask for
    # N x all cores, which makes every rank slower and the figures meaningless.
    return max(1, (cpus or available_cpus()) // devices)


def rank_threads(platform: Platform, ranks: int) -> int:
    """Threads of each rank: its share of the host's cores where ranks share them, else one."""
    return threads_per_rank(ranks) if platform.shares_cores else 1
