"""Launcher pieces that need no ranks: signal bookkeeping around a launch."""

from __future__ import annotations

import os
import signal
from types import FrameType

from pytest_distperf.launcher import _own_signals, _SignalsSeen


def test_signals_are_noted_whoever_handles_them_and_handlers_come_back() -> None:
    caught: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    before = signal.getsignal(signal.SIGHUP)
    previous_usr1 = signal.signal(signal.SIGUSR1, handler)
    try:
        seen = _SignalsSeen()
        with _own_signals(seen):
            # what the elastic agent does: replace a handler for the run
            signal.signal(signal.SIGHUP, handler)
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGHUP)
        assert caught == [signal.SIGUSR1, signal.SIGHUP]
        assert {signal.SIGUSR1, signal.SIGHUP} <= seen.seen
        assert signal.getsignal(signal.SIGHUP) is before
        assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was given back too
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)


def test_nothing_seen_when_nothing_arrives() -> None:
    seen = _SignalsSeen()
    with _own_signals(seen):
        pass
    assert seen.seen == set()
