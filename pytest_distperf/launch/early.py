"""The session's first pool, started once collection has selected distperf tests: its ranks
start while the pytest process probes the topology and runs what comes first (issue 11)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pytest_distperf import xdist

NO_TEST_BODY = ("collectonly", "setuponly", "setupplan")


def start_first_pool(plugin: Any, config: Any, devices: int) -> None:
    """Start `plugin`'s pool of `devices` ranks unless the session will not use one: no test
    body, ranks that are no pool's (job, fresh ranks, NUMA binding), an xdist worker (on first
    use) or too few GPUs (the test skips)."""
    settings = plugin.settings
    no_pool = plugin.job or settings.fresh_ranks or settings.numa_binding or xdist.is_worker(config)
    if no_pool or any(getattr(config.option, name, False) for name in NO_TEST_BODY):
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
