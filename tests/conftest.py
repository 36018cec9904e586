from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Generator, Iterator
from typing import Any

# Imported once here, before any in-process pytester run: pytester restores sys.modules after
# each run, and a second import of torch (or of numpy's C extensions, which LitGPT's import pulls
# in through scipy) in the same process crashes it.
import numpy.fft  # noqa: F401
import pytest
import torch  # noqa: F401
from helpers import SHARED_CACHE_VARIABLE, TAG_VARIABLE, TESTS, wait_until_gone
from rank_guard import FORBID_RANKS, PLUGIN, install

install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator:
    """The fast tier starts no rank process: in a test not marked `slow` (its fixtures and
    the pytest sessions it runs included, which load the guard), the pool and the launchers
    refuse to start ranks (rank_guard.py)."""
    if item.get_closest_marker("slow") is not None:
        return (yield)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FORBID_RANKS, item.nodeid)
        patch.setenv("PYTEST_PLUGINS", PLUGIN)
        patch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, (str(TESTS), os.environ.get("PYTHONPATH"))))
        )
        return (yield)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked `gpu` skips, saying why, where torch sees no CUDA device."""
    if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device; torch sees none here")


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One pytest cache for the pytest sessions the suite runs: the first session of a rank
    count calibrates the collectives, later ones reuse them (the calibration's own tests keep
    their own caches)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SHARED_CACHE_VARIABLE, str(tmp_path_factory.mktemp("shared-cache")))
        yield


@pytest.fixture(scope="session")
def shared_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of ranks that several of the suite's sessions share (tests/shared_pool.py),
    started with the first session that asks; stopped, and none of its processes left, at the
    end."""
    address = str(tmp_path_factory.mktemp("shared-pool") / "socket")
    value = uuid.uuid4().hex
    environ = {**os.environ, TAG_VARIABLE: value}
    environ.pop(FORBID_RANKS, None)
    host = subprocess.Popen([sys.executable, str(TESTS / "shared_pool.py"), address], env=environ)
    deadline = time.monotonic() + 60
    while not os.path.exists(address) and host.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(address), f"the shared pool's host did not start (exit {host.poll()})"
    yield address
    from shared_pool import stop

    stop(address)
    host.wait(timeout=30)
    assert wait_until_gone(value) == []


@pytest.fixture
def tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A tag the processes this test starts inherit: none may outlive it by 15 s."""
    value = uuid.uuid4().hex
    monkeypatch.setenv(TAG_VARIABLE, value)
    yield value
    assert wait_until_gone(value) == []


@pytest.fixture(scope="module")
def cpu_pools() -> Iterator[Any]:
    """One pool of CPU ranks for a module that runs specs in it directly (launch.pool.Pools),
    as a session runs its tests. Closed with the module: idle ranks left running would take
    CPU from the timed runs of the modules after it."""
    from pytest_distperf.launch.pool import Pools

    pools = Pools()
    yield pools
    pools.close()
