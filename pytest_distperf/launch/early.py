"""The session's first pool, started before its first test needs it (issue 11: the first timed
token soon after pytest starts): when collection has selected distperf tests, the ranks import
torch and Lightning and join their group while the pytest process probes the topology and runs
whatever comes before the first distperf test.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pytest_distperf import xdist
from pytest_distperf.launch.guard import ranks_forbidden

NO_TEST_BODY = ("collectonly", "setuponly", "setupplan")


def start_first_pool(plugin: Any, config: Any, devices: int) -> None:
    """Start `plugin`'s (plugin.DistperfPlugin) pool of `devices` ranks unless the session
    will not use one: no test body runs, its ranks are not a pool's (job mode, fresh ranks,
    NUMA binding), an xdist worker (which may run none of the distperf tests: on first use), or
    a CUDA test that lacks its GPUs (it skips), or where ranks are forbidden (launch/guard.py:
    a test that needs them is refused when it asks)."""
    settings = plugin.settings
    if plugin.job or settings.fresh_ranks or settings.numa_binding or xdist.is_worker(config):
        return
    if ranks_forbidden() is not None:
        return
    if any(getattr(config.option, name, False) for name in NO_TEST_BODY):
        return
    resolved = plugin.resolve()
    if resolved.lacks_gpus(devices):
        return
    from pytest_distperf.launch.pool import PoolKey, Pools

    plugin.pools = plugin.pools or Pools()
    plugin.pools.start(PoolKey.for_ranks(resolved.accelerator, devices))


def process_started_at() -> float:
    """Epoch seconds at which this process started, as a user counts pytest's start (the
    interpreter and the plugins load before the plugin does); now, where /proc cannot tell."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])  # same clock: since boot
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(uptime - started / os.sysconf("SC_CLK_TCK"), 0.0)
