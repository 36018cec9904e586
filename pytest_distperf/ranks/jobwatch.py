"""One test's run in a launched job, watched from beside it: its deadline, and a failure in any
rank, which would leave its peers waiting in a collective. Each run has a board in the job's
store, which answers while a collective hangs: `first` (the first `Fault`), `wake/<rank>` (what
that rank's watch acts on, or "done") and `hung/<rank>` (where the deadline found its code)."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

import torch.distributed as dist

RAISED, TIMEOUT, STOPPED, DONE = "raised", "timeout", "stopped", "done"
# After the deadline: time for a rank pulled out of its test to fail it and for its peers to see
# that, before faulthandler exits a rank that never came back.
EXIT_GRACE_S = 30.0
# After a timeout: how long rank 0's watch waits for its test to return (and pytest to report
# it) before it says itself why the job stops.
NOTICE_AFTER_S = 5.0
# Ignored by default: one that arrives once the run is over does nothing.
INTERRUPT_SIGNAL = signal.SIGURG
TRACEBACK_LINES = 60

T = TypeVar("T")


@dataclass(frozen=True)
class Fault:
    """What stopped a run, as one rank saw it."""

    rank: int
    kind: str  # RAISED, TIMEOUT, or STOPPED: the rank's session was stopped (Ctrl-C, a signal)
    text: str  # the traceback, or what happened in words
    elapsed_s: float  # since the run began in that rank

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes) -> Fault:
        return cls(**json.loads(raw))

    @classmethod
    def of(cls, rank: int, error: BaseException, elapsed_s: float) -> Fault:
        kind = RAISED if isinstance(error, Exception) else STOPPED
        kind = error.kind if isinstance(error, Interrupted) else kind
        lines = "".join(traceback.format_exception(error)).splitlines()
        return cls(rank, kind, "\n".join(lines[-TRACEBACK_LINES:]), elapsed_s)


class Interrupted(Exception):
    """Raised in a rank's main thread by its watch: another rank failed, or the deadline passed."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"this rank's run was stopped ({kind})")
        self.kind = kind


class RunWatch:
    """This rank's watch over one run: `run(body)`, then `settle(...)` if it failed in any rank;
    `notice` (rank 0's) is called when the test has not come back a while after the deadline."""

    def __init__(
        self,
        board: dist.Store,
        rank: int,
        world: int,
        timeout: float,
        notice: Callable[[], None] | None = None,
    ) -> None:
        self.board, self.rank, self.world, self.timeout = board, rank, world, timeout
        self.notice = notice
        self.stopped: str | None = None  # what the watch stopped the run for
        self._lock = threading.Lock()
        self._running = False
        self._interrupt: str | None = None  # for the main thread's signal handler
        self._main: int | None = None
        self._previous: Any = None
        self._returned = threading.Event()
        self._started = 0.0
        self._thread: threading.Thread | None = None

    def run(self, body: Callable[[], T]) -> T:
        """`body()` under the watch. Raises what it raises, or `Interrupted` (at most once a
        run, possibly inside `finish`: call `finish` again after catching it)."""
        try:
            self._start()
            return body()
        finally:
            self.finish()

    def _start(self) -> None:
        self._started, self._running = time.monotonic(), True
        # The last resort, for a rank stuck where no signal reaches (C code holding the GIL).
        faulthandler.dump_traceback_later(
            self.timeout + EXIT_GRACE_S, exit=True, file=sys.__stderr__
        )
        if threading.current_thread() is threading.main_thread():
            self._main = threading.main_thread().ident
            self._previous = signal.signal(INTERRUPT_SIGNAL, self._on_signal)
        # Its own connection: a store client serves one request at a time, and the wait holds it.
        store = self.board.clone()
        self._thread = threading.Thread(
            target=self._watch, args=(store,), name="distperf-job-watch", daemon=True
        )
        self._thread.start()

    def finish(self) -> None:
        """End the watch (again: harmless)."""
        with self._lock:
            was_running, self._running, self._interrupt = self._running, False, None
        if not was_running:
            return
        if self._main is not None and self._previous is not None:  # None: not set from Python
            signal.signal(INTERRUPT_SIGNAL, self._previous)
        self._returned.set()
        with contextlib.suppress(dist.DistError):  # the job's store is gone: the job is ending
            self.board.set(f"wake/{self.rank}", DONE)
        if self._thread is not None:
            self._thread.join(timeout=NOTICE_AFTER_S)
        faulthandler.cancel_dump_traceback_later()

    def failed_elsewhere(self) -> bool:
        """After a run that returned here: did it fail in another rank, or time out?"""
        return self.stopped is not None or self.board.check(["first"])

    def settle(self, error: BaseException | None, elapsed_s: float) -> tuple[Fault, list[Fault]]:
        """After a failed run: publish this rank's error (the cause if it came first); the cause
        and where the deadline found each hung rank."""
        if error is None:
            first = Fault.decode(self.board.get("first"))
        else:
            own = Fault.of(self.rank, error, elapsed_s)
            # Pulled out of its own code, not out of a wait that had already failed.
            if isinstance(error, Interrupted) and own.kind == TIMEOUT and not error.__context__:
                self.board.set(f"hung/{self.rank}", own.encode())
            first = self.publish(own, self.board)
        hung = [f"hung/{rank}" for rank in range(self.world)]
        found = [key for key in hung if self.board.check([key])]
        return first, [Fault.decode(raw) for raw in (self.board.get(key) for key in found)]

    def publish(self, fault: Fault, store: dist.Store) -> Fault:
        """`fault` as the run's first failure unless there is one already (its writer wakes every
        other rank's watch); the first either way."""
        encoded = fault.encode()
        first = store.compare_set("first", "", encoded)
        if first != encoded.encode():
            return Fault.decode(first)
        for rank in range(self.world):
            if rank != self.rank:
                store.set(f"wake/{rank}", fault.kind)
        return fault

    def _watch(self, store: dist.Store) -> None:
        key = f"wake/{self.rank}"
        try:
            store.wait([key], timedelta(seconds=max(self._left(), 0.001)))
            kind = store.get(key).decode()
        except dist.DistStoreError:  # the wait's own timeout: the deadline
            kind = TIMEOUT
        except dist.DistError:  # the job's store is gone: the job is ending anyway
            return
        with self._lock:
            if kind == DONE or not self._running:
                return
            self.stopped = kind
        if kind == TIMEOUT:
            self._timed_out(store)
        # An NCCL collective waiting for a rank that is gone never ends on its own; a gloo one does.
        if dist.is_initialized() and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
        with self._lock:  # never after `finish` has put the previous handler back
            if self._running and self._main is not None:
                self._interrupt = kind
                signal.pthread_kill(self._main, INTERRUPT_SIGNAL)
        # Stopped for another rank's failure: the deadline still holds if this run never returns.
        if kind != TIMEOUT:
            if self._returned.wait(self._left()):
                return
            self._timed_out(store)
        if self.notice is not None and not self._returned.wait(NOTICE_AFTER_S):
            self.notice()

    def _timed_out(self, store: dist.Store) -> None:
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        reason = f"still running after --distperf-timeout={self.timeout:g} s"
        self.publish(Fault(self.rank, TIMEOUT, reason, self.timeout), store)

    def _left(self) -> float:
        return max(self._started + self.timeout - time.monotonic(), 0.0)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        kind, self._interrupt = self._interrupt, None
        if kind is not None:
            raise Interrupted(kind)
        if callable(self._previous):
            self._previous(signum, frame)
