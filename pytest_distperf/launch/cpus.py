"""CPU shares for CPU ranks: N ranks on a shared host must never ask for N x all cores."""

from __future__ import annotations

from pytest_distperf.platform import Platform
from pytest_distperf.topology.host import available_cpus


def rank_threads(platform: Platform, ranks: int) -> int:
    """Threads of each rank: an equal share of the host's cores (at least one) where ranks
    share them, which N x all cores would make every rank slower; else one."""
    return max(1, available_cpus() // ranks) if platform.shares_cores else 1
