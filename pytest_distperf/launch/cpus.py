"""CPU shares for CPU ranks: N ranks on a shared host must never ask for N x all cores."""

from __future__ import annotations

import os


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(devices: int, cpus: int | None = None) -> int:
    # Ranks share the cores: give each an equal share (at least one) so N ranks never ask for
    # N x all cores, which makes every rank slower and the figures meaningless.
    return max(1, (cpus or available_cpus()) // devices)
