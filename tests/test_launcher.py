"""Launcher pieces that need no ranks: signal bookkeeping around a launch."""

from __future__ import annotations

import os
import signal
from types import FrameType

from pytest_distperf.launch.signals import own_signals


def test_signals_are_noted_whoever_handles_them_and_handlers_come_back() -> None:
    caught: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    before = signal.getsignal(signal.SIGHUP)
    previous_usr1 = signal.signal(signal.SIGUSR1, handler)
    try:
        seen: set[int] = set()
        with own_signals(seen):
            # what the elastic agent does: replace a handler for the run
            signal.signal(signal.SIGHUP, handler)
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGHUP)
        assert caught == [signal.SIGUSR1, signal.SIGHUP]
        assert {signal.SIGUSR1, signal.SIGHUP} <= seen
        assert signal.getsignal(signal.SIGHUP) is before
        assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was given back too
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)


def test_nothing_seen_when_nothing_arrives() -> None:
    seen: set[int] = set()
    with own_signals(seen):
        pass
    assert seen == set()


def test_numa_binding_is_torchs_own() -> None:
    import pytest
    from torch.numa.binding import AffinityMode

    from pytest_distperf.launch.elastic import RunFailed, numa_options
    from pytest_distperf.spec import RunSpec, Workload

    spec = RunSpec("t.py::test", "fsdp", 2, "cuda", Workload(), 5, 1, 60.0)
    assert numa_options(spec) is None
    bound = numa_options(
        RunSpec("t.py::test", "fsdp", 2, "cuda", Workload(), 5, 1, 60.0, numa_binding="exclusive")
    )
    assert bound.affinity_mode == AffinityMode.EXCLUSIVE
    cpu = RunSpec("t.py::test", "fsdp", 2, "cpu", Workload(), 5, 1, 60.0, numa_binding="node")
    with pytest.raises(RunFailed, match="numa-binding=node binds each rank.*run on cpu"):
        numa_options(cpu)


def test_numa_binding_without_torch_support_is_named(monkeypatch) -> None:
    import sys

    import pytest

    from pytest_distperf.launch.elastic import RunFailed, numa_options
    from pytest_distperf.spec import RunSpec, Workload

    monkeypatch.setitem(sys.modules, "torch.numa.binding", None)  # as on a torch without it
    spec = RunSpec("t.py::test", "fsdp", 2, "cuda", Workload(), 5, 1, 60.0, numa_binding="node")
    with pytest.raises(RunFailed, match=r"needs torch's NUMA binding \(torch.numa.binding\)"):
        numa_options(spec)
