"""The host CPU's own speed, timed with a fixed piece of interpreter work beside each repeat: it
says whether the machine rather than the code got slower (docs/benchmarks/h200-2026-11-30.md)."""

from __future__ import annotations

import os
import re
import time

LOOP_ITERATIONS = 200_000  # short, yet far above timer noise on the hosts measured


def interpreter_loop_seconds(iterations: int = LOOP_ITERATIONS) -> float:
    """Seconds this core takes for a fixed loop of integer arithmetic."""
    return interpreter_loop_times(iterations)[0]


def interpreter_loop_times(iterations: int = LOOP_ITERATIONS) -> tuple[float, float]:
    """(wall, this thread's CPU) seconds of the fixed loop: the CPU time is the core's own speed."""
    start, cpu_start = time.perf_counter(), time.thread_time()
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return time.perf_counter() - start, time.thread_time() - cpu_start


def host_times() -> tuple[float, float | None, float | None]:
    """(this process's CPU seconds, its threads' wait runnable for a core, the hypervisor's steal
    from an average CPU); None where the kernel keeps no such figure."""
    cpu = time.process_time()
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return cpu, None, host_steal_seconds()
    waited_ns = 0
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat") as stat:
                waited_ns += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return cpu, waited_ns / 1e9, host_steal_seconds()


def thread_times() -> tuple[float, float] | None:
    """(seconds on a core, seconds runnable in the run queue) of the calling thread so far; None
    where the kernel keeps none."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            ran_ns, queued_ns = stat.read().split()[:2]
        return int(ran_ns) / 1e9, int(queued_ns) / 1e9
    except (OSError, ValueError):
        return None


def host_steal_seconds(stat_path: str = "/proc/stat") -> float | None:
    """Steal time of this host's CPUs over their number; None where the file or field is missing."""
    try:
        with open(stat_path) as stat:
            lines = stat.read().splitlines()
        fields = lines[0].split()
        cpus = sum(1 for line in lines if re.match(r"cpu\d+ ", line))
        ticks = int(fields[8])  # cpu user nice system idle iowait irq softirq steal ...
    except (OSError, IndexError, ValueError):
        return None
    if fields[0] != "cpu" or not cpus:
        return None
    return ticks / os.sysconf("SC_CLK_TCK") / cpus
