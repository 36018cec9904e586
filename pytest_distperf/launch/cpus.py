"""CPU ranks' share of the host: N ranks must never ask for N x all cores, and their memory
allocator must not make one step of every few pay page faults the others do not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# glibc's malloc, as CPU ranks run it: by default a buffer over its mmap threshold (32 MB at
# most) is mapped fresh and unmapped again on every use, and gloo's threads get arenas too
# small for a model's flat buffers, so steps alternate between a fast and a page-faulting slow
# mode. Kept mapped and in one arena, every repeat does the same work
# (docs/benchmarks/cpu-2026-12-02-train.md). glibc reads them once, when a process starts.
RANK_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 32),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
    "MALLOC_ARENA_MAX": "1",
}


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """`values` set in this process's environment while ranks start (they inherit it at
    start), then restored."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def rank_environment(accelerator: str, threads: int | None = None) -> dict[str, str]:
    """What CPU ranks start with: the allocator settings above (a user's own win), and their
    thread share where given."""
    if accelerator != "cpu":
        return {}
    values = {k: os.environ.get(k, v) for k, v in RANK_MALLOC.items()}
    if threads is not None:
        values.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return values


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(devices: int, cpus: int | None = None) -> int:
    # Ranks share the cores: give each an equal share (at least one) so N ranks never ask for
    # N x all cores, which makes every rank slower and the figures meaningless.
    return max(1, (cpus or available_cpus()) // devices)
