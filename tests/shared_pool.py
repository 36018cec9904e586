"""Ranks shared between the suite's own pytest sessions (issue 37): one host process keeps a
rank pool (launch.pool.Pools) and runs the tests of several sessions in it, one session after
another, so that their ranks start once instead of once per session.

Only sessions whose ranks need nothing of their own share it: no environment read in the
ranks, no files written relative to the ranks' directory, no rank output or progress asserted.
Every behaviour of a session's own pool (early start, output sections, faults, fresh ranks, a
comm environment) keeps tests whose sessions start their own ranks.

    python shared_pool.py ADDRESS              the host, serving until told to stop
    pytest -p shared_pool                      a session whose runs go to the host at
                                               $DISTPERF_TEST_SHARED_POOL
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Client, Listener
from typing import Any

import pytest
from helpers import SHARED_POOL_VARIABLE

AUTHKEY = b"distperf-suite"
RUN, STOP = "run", "stop"


def serve(address: str) -> None:
    """Run each RunSpec a session sends in one Pools, until a stop message."""
    from pytest_distperf.launch.failures import RunFailed
    from pytest_distperf.launch.pool import Pools

    pools = Pools()
    try:
        with Listener(address, family="AF_UNIX", authkey=AUTHKEY) as listener:
            while True:
                with listener.accept() as connection:
                    message, spec = connection.recv()
                    if message == STOP:
                        return
                    try:
                        result = pools.run(spec)
                    except RunFailed as failed:
                        connection.send((False, (str(failed), failed.stops), pools.last_output))
                    else:
                        connection.send((True, result, pools.last_output))
    finally:
        pools.close()


def stop(address: str) -> None:
    with Client(address, family="AF_UNIX", authkey=AUTHKEY) as connection:
        connection.send((STOP, None))


class SharedPools:
    """Stands in for a session's launch.pool.Pools: its runs go to the host."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.last_output: dict[int, str] = {}

    def start(self, key: Any) -> None:
        """The host's ranks are up already, or start with the first run."""

    def run(self, spec: Any, live: Any = None, progress: Any = None) -> Any:
        from pytest_distperf.launch.failures import RunFailed

        with Client(self.address, family="AF_UNIX", authkey=AUTHKEY) as connection:
            connection.send((RUN, spec))
            ran, value, self.last_output = connection.recv()
        if not ran:
            raise RunFailed(*value)
        return value

    def close(self, kill: bool = False) -> None:
        """The host keeps its ranks for the next session."""


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin("distperf-session")
    plugin.pools = SharedPools(os.environ[SHARED_POOL_VARIABLE])


if __name__ == "__main__":
    serve(sys.argv[1])
