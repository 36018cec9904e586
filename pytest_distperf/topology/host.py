"""Facts about the CPU host (model, usable CPUs, sockets, memory) and the CPU-rank topology."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from pytest_distperf.topology.model import LOOPBACK, Device, Link, Topology

_CPUINFO = Path("/proc/cpuinfo")


def _parse_cpuinfo(text: str) -> tuple[str | None, int]:
    """(CPU model name or None, socket count) from /proc/cpuinfo text."""
    model: str | None = None
    sockets: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), " ".join(value.split())
        if key == "model name" and model is None and value:
            model = value
        elif key == "physical id":
            sockets.add(value)
    return model, len(sockets) or 1


def available_cpus() -> int:
    # The affinity mask is what this process may use (containers, taskset); cpu_count is the host.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _host_memory_bytes() -> int:
    # Linux's sysconf answers from the kernel's total RAM, /proc/meminfo's MemTotal.
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def host_facts() -> tuple[str, int, int]:
    """(CPU model, usable CPUs, sockets)."""
    try:
        text = _CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    model, sockets = _parse_cpuinfo(text)
    if not model:
        model = platform.processor() or platform.machine() or "cpu"
    return model, available_cpus(), sockets


def probe_cpu(ranks: int) -> Topology:
    """`ranks` CPU processes on this host, joined by loopback (gloo over 127.0.0.1)."""
    if ranks < 1:
        raise ValueError(f"a CPU run needs at least one rank, got {ranks}")
    model, cpus, sockets = host_facts()
    memory = _host_memory_bytes()
    devices = tuple(Device(index=i, name=model, memory_bytes=memory) for i in range(ranks))
    links = tuple(Link(a, b, LOOPBACK) for a in range(ranks) for b in range(a + 1, ranks))
    notes = ()
    if ranks > cpus:
        notes = (f"{ranks} ranks share {cpus} usable CPUs: ranks will time-slice",)
    return Topology("cpu", devices, links, "cpu", cpus, sockets, notes)
