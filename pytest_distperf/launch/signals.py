"""Signals that stop the whole session (a CI runner's cancel, a closed terminal) while ranks run,
never just one test."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
STOPPING_SIGNALS = frozenset(HANDLED_SIGNALS) - {signal.SIGINT}  # SIGINT: KeyboardInterrupt


class SessionStopped(BaseException):
    """A stopping signal asked the whole session to stop: a BaseException, which nothing on the
    way takes for one test's failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def session_stop(signum: int) -> BaseException:
    """What a signal raises once the ranks are stopped: Ctrl-C pytest's own, others ours."""
    return KeyboardInterrupt() if signum == signal.SIGINT else SessionStopped(signum)


@contextlib.contextmanager
def own_signals(signals: set[int]) -> Iterator[None]:
    """Give pytest its signal handlers back afterwards (the elastic agent leaves its own) and note
    in `signals` each one that arrives meanwhile, whichever handler is installed (wakeup fd)."""
    saved = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    try:
        previous_fd: int | None = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread: signals go to the main thread's handlers anyway
        previous_fd = None
    try:
        yield
    finally:
        if previous_fd is not None:
            signal.set_wakeup_fd(previous_fd)
            with contextlib.suppress(BlockingIOError):
                signals.update(reader.recv(4096))
        reader.close()
        writer.close()
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def stopping_signals() -> Iterator[None]:
    """While a test's ranks run, the stopping signals end the session (SessionStopped)."""

    def stop(signum: int, frame: object) -> None:
        raise SessionStopped(signum)

    saved = {s: signal.getsignal(s) for s in STOPPING_SIGNALS}
    try:
        for sig in STOPPING_SIGNALS:
            signal.signal(sig, stop)
    except ValueError:  # not the main thread: leave the handlers alone
        saved = {}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
