"""Signals that stop the whole session (a CI runner's cancel, a closed terminal) while ranks run,
never just one test."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Iterator


class SessionStopped(BaseException):
    """A signal (SIGTERM, SIGHUP, SIGQUIT) asked the whole session to stop: a BaseException, which
    nothing on the way takes for one test's failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
STOPPING_SIGNALS = frozenset(HANDLED_SIGNALS) - {signal.SIGINT}  # SIGINT: KeyboardInterrupt


@contextlib.contextmanager
def own_signals(signals: set[int] | None = None) -> Iterator[None]:
    """Give pytest its signal handlers back (the elastic agent leaves its own: a Ctrl-C would
    only fail the next test); note in `signals` each one that arrives meanwhile, through the
    wakeup fd, written whichever handler is installed."""
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
            if signals is not None:
                with contextlib.suppress(BlockingIOError):
                    signals.update(reader.recv(4096))
        reader.close()
        writer.close()
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def stopping_signals() -> Iterator[None]:
    """While a test's ranks run, SIGTERM, SIGHUP and SIGQUIT end the session (SessionStopped);
    SIGINT keeps pytest's KeyboardInterrupt."""

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
