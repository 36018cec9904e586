"""glibc's allocator in CPU ranks: keep the heap a step grows, so every timed step does the same
work (docs/benchmarks/cpu-2026-12-02-train.md), and give it back between tests, so each test's
memory peak is its own. The environment's variables win. No torch: pool ranks call this first."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import resource
import sys

# mallopt's parameters (malloc.h) and the largest value it takes (an int).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_KEPT_BYTES = (1 << 31) - 1
# (the environment variable that overrides it, mallopt's parameter, the rank's value)
SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, _KEPT_BYTES),
    ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, _KEPT_BYTES),
    ("MALLOC_ARENA_MAX", _M_ARENA_MAX, 1),
)


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    with contextlib.suppress(OSError):
        return ctypes.CDLL(None)
    return None


_kept = ""  # the settings keep_heap applied, as the result's versions report them


def keep_heap() -> str:
    """Set the allocator settings the environment does not, before any thread starts (a thread
    keeps its arena); what it runs with ("" where not glibc's)."""
    global _kept
    libc = _glibc()
    if libc is None:
        return ""
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    for name, parameter, value in SETTINGS:
        if name not in os.environ:
            libc.mallopt(parameter, value)
    _kept = " ".join(f"{name}={os.environ.get(name, value)}" for name, _, value in SETTINGS)
    return _kept


def settings() -> str:
    """What keep_heap set in this process; "" where it never ran."""
    return _kept


def release_heap() -> None:
    """Give the freed heap back: the next peak starts where a fresh process's would."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def minor_faults() -> int:
    """Minor page faults of the whole process (every thread) so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


_MADV_POPULATE_WRITE = 23  # Linux 5.14 on: fault pages in, writable, without writing them
# Free heap faulted in before a calibration: its fresh buffers (64 MiB copies, all-gathers) must
# land in resident pages, as a warmed-up step's do, wherever the allocator places each one.
CALIBRATION_PAD = 512 << 20


def fault_in_heap(pad_bytes: int) -> int:
    """Grow the heap by `pad_bytes`, then fault all of it in for later steps to reuse without
    page faults: the bytes made resident (0: cannot)."""
    libc = _glibc()
    if libc is None:
        return 0
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(pad_bytes))  # the top chunk, kept (trim threshold), not yet touched
    span = _heap_span()
    if span is None:
        return 0
    start, end = span
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
        return 0
    return end - start


def _heap_span() -> tuple[int, int] | None:
    """(start, end) of the main arena's heap, from the process's memory map."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith("[heap]"):
                start, end = line.split()[0].split("-")
                return int(start, 16), int(end, 16)
    return None
