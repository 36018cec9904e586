"""Peak memory of one test in a rank that may have run others: the allocator's peak, else the
RSS high-water mark (reset through /proc/self/clear_refs), else the process-lifetime peak."""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

import torch

from pytest_distperf.platform import platform_of
from pytest_distperf.ranks import allocator

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_RESET_HIGH_WATER_MARK = "5"  # proc(5): "reset the peak resident set size"


def reset_peak(device: torch.device) -> None:
    """Start a new peak (an RSS one after the kept heap goes back to the kernel)."""
    if platform_of(device.type).allocator_memory:
        torch.cuda.reset_peak_memory_stats(device)
        return
    allocator.release_heap()
    with contextlib.suppress(OSError):  # the high-water mark then keeps earlier tests' peak
        _CLEAR_REFS.write_text(_RESET_HIGH_WATER_MARK)


def peak(device: torch.device) -> tuple[int, str]:
    """(bytes, what they are) since the last reset_peak."""
    if platform_of(device.type).allocator_memory:
        return int(torch.cuda.max_memory_allocated(device)), "cuda allocator peak"
    high = _status_bytes("VmHWM:")
    if high is not None:
        return high, "process RSS peak"
    # ru_maxrss is in KiB on Linux and covers the whole process life.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS peak (lifetime)"


def resident() -> int | None:
    """This process's resident set now (bytes); None where /proc has none."""
    return _status_bytes("VmRSS:")


def _status_bytes(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
