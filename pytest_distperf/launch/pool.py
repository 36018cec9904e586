"""A pool of rank processes kept for the session, one RunSpec per test: starting ranks costs more
than a small test's timed work. A test that raises, hangs or loses a rank stops the pool."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TextIO

from pytest_distperf.launch.failures import (
    RunFailed,
    failure_message,
    output_tail,
    timeout_headline,
    where,
)
from pytest_distperf.launch.signals import stopping_signals
from pytest_distperf.measured import RunResult
from pytest_distperf.platform import Platform, platform_of
from pytest_distperf.ranks.serve import DONE, PROGRESS, READY, RUN, STOP, STORE, RankPlace
from pytest_distperf.spec import RunSpec
from pytest_distperf.topology.host import available_cpus

# Variables that change how ranks talk to each other or what they run on: pools differ when
# these do, even after a pool's first test (ranks read them once, at their start).
POOL_VARIABLES = (
    *("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_IB_DISABLE"),
    *("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE"),
    *("NCCL_CUMEM_ENABLE", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF"),
)
START_TIMEOUT_S = 300.0  # process start, imports, process group
GRACE_S = 10.0  # past the timeout, for the ranks' own watchdogs to dump their stacks
FAILED_GRACE_S = 3.0  # for the other ranks' replies once one rank has failed
STOP_WAIT_S = 5.0
OUTPUT_SECTION_LINES = 200  # of each rank's output shown with a failed test
STREAM_POLL_S = 0.1

Replies = dict[int, tuple[str, Any]]


def start_timeout_headline(spec: RunSpec) -> str:
    return (
        f"distperf: the rank pool did not start within {START_TIMEOUT_S:g} s (process start, "
        f"imports, process group) {where(spec)}; each rank's output follows."
    )


def rank_threads(platform: Platform, ranks: int) -> int:
    """Threads of each rank: where ranks share the host's cores an equal share (N x all cores
    would make every rank slower), else one."""
    return max(1, available_cpus() // ranks) if platform.shares_cores else 1


@dataclass(frozen=True)
class PoolKey:
    """What makes two tests able to share ranks."""

    accelerator: str
    ranks: int
    comm_environment: tuple[tuple[str, str], ...] = ()

    @classmethod
    def for_ranks(
        cls, accelerator: str, ranks: int, environ: Mapping[str, str] = os.environ
    ) -> PoolKey:
        comm = tuple((name, environ[name]) for name in POOL_VARIABLES if environ.get(name))
        return cls(accelerator, ranks, comm)


class RankPool:
    """The ranks of one PoolKey; `run(spec)` returns a RunResult or raises RunFailed."""

    def __init__(self, key: PoolKey) -> None:
        from pytest_distperf.ranks.serve import serve

        self.key = key
        self.tests_run = 0
        self.ready = False  # every rank has joined the process group
        self.last_output: dict[int, str] = {}  # each rank's output during the last test
        self._started_in = _surroundings()
        self._log_dir = Path(tempfile.mkdtemp(prefix="distperf-pool-"))
        context = multiprocessing.get_context("spawn")
        threads = rank_threads(platform_of(key.accelerator), key.ranks)
        self._processes: list[Any] = []
        self._connections: list[Connection] = []
        self.log_paths = [self._log_dir / f"rank-{rank}.log" for rank in range(key.ranks)]
        parent, comm = os.getpid(), key.comm_environment
        try:
            for rank, log in enumerate(self.log_paths):
                ours, theirs = context.Pipe()
                place = RankPlace(rank, key.ranks, key.accelerator, str(log), threads, parent, comm)
                name = f"distperf-{rank}"
                process = context.Process(target=serve, args=(place, theirs), name=name)
                self._connections.append(ours)
                try:
                    process.start()
                finally:
                    theirs.close()  # the rank holds its own end now (or never will)
                self._processes.append(process)
        except BaseException:  # a Ctrl-C halfway: the ranks already started go too
            self.close(kill=True)
            raise

    @property
    def alive(self) -> bool:
        return bool(self._processes) and all(p.is_alive() for p in self._processes)

    def fits(self, key: PoolKey) -> bool:
        """Whether the next test of `key` can run in these ranks (a pool started ahead of its first
        test in that test's environment and directory)."""
        if self.key != key or not self.alive:
            return False
        return self.tests_run > 0 or self._started_in == _surroundings()

    def run(
        self,
        spec: RunSpec,
        live: TextIO | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Run one test; `live`: where the ranks' output streams (pytest -s)."""
        launched_at, start = time.time(), time.perf_counter()
        offsets = [p.stat().st_size if p.exists() else 0 for p in self.log_paths]
        try:
            with _streamed(self.log_paths, offsets, live):
                if not self.ready:  # first use: every rank joins the process group
                    replies = self._collect(START_TIMEOUT_S, expect=READY)
                    self._raise_failed(spec, replies, READY, start, start_timeout_headline(spec))
                    self.ready = True
                running_from = time.perf_counter()  # the ranks' watchdogs count from here
                for connection in self._connections:
                    connection.send((RUN, spec))
                replies = self._collect(spec.timeout + GRACE_S, expect=DONE, progress=progress)
        finally:
            # Read before a failure stops the pool and its logs go.
            self.last_output = {
                rank: output_tail(path, lines=OUTPUT_SECTION_LINES, start=offset)
                for rank, (path, offset) in enumerate(zip(self.log_paths, offsets, strict=True))
            }
        self.tests_run += 1
        timed_out = time.perf_counter() - running_from >= spec.timeout
        self._raise_failed(spec, replies, DONE, start, timeout_headline(spec), timed_out)
        ranks = tuple(replies[r][1] for r in sorted(replies))
        return RunResult(spec, ranks, time.perf_counter() - start, launched_at)

    def _collect(
        self, timeout: float, expect: str, progress: Callable[[str], None] | None = None
    ) -> Replies:
        """Every rank's reply, (status, text) where it raised, died or timed out; on the way,
        progress goes to `progress` and rank 0's store port to the others."""
        replies: Replies = {}  # in order of arrival: the first failure leads
        pending = dict(enumerate(self._connections))
        deadline = time.monotonic() + timeout
        with stopping_signals():
            while pending:
                # Once one rank has failed, the others are likely stuck in a collective with it.
                if any(kind != expect for kind, _ in replies.values()):
                    deadline = min(deadline, time.monotonic() + FAILED_GRACE_S)
                ready = wait(list(pending.values()), timeout=max(deadline - time.monotonic(), 0))
                if not ready:
                    replies.update(dict.fromkeys(pending, ("timeout", "")))
                    self.stop(kill=True)
                    break
                for rank, connection in list(pending.items()):
                    if connection not in ready:
                        continue
                    try:
                        message = connection.recv()
                    except (EOFError, OSError):
                        message = ("died", "")
                    if message[0] == PROGRESS:  # not a reply: this rank's reply is still due
                        if progress is not None:
                            progress(message[1])
                    elif message[0] == STORE:  # nor this: the others join through rank 0's store
                        for other in self._connections[1:]:
                            with contextlib.suppress(OSError):  # a rank gone: seen as such
                                other.send(message)
                    else:
                        del pending[rank]
                        replies[rank] = message
        if any(kind == "died" for kind, _ in replies.values()):
            self.stop(kill=True)  # let the exit codes settle before they are read
            # A Ctrl-C that reached a rank before this process: still the user's interrupt.
            if any(p.exitcode == -signal.SIGINT for p in self._processes):
                raise KeyboardInterrupt
        return replies

    def _raise_failed(
        self,
        spec: RunSpec,
        replies: Replies,
        expect: str,
        start: float,
        timeout: str,
        late: bool = False,
    ) -> None:
        """RunFailed where a rank's reply is not `expect`, headed `timeout` where one timed out or
        the ranks' watchdogs were due (`late`)."""
        failed = {rank: text for rank, (kind, text) in replies.items() if kind != expect}
        if not failed:
            return
        elapsed = time.perf_counter() - start
        self.stop(kill=True)
        late = late or any(replies[rank][0] == "timeout" for rank in failed)

        def output(rank: int) -> str:
            return failed.get(rank) or output_tail(self.log_paths[rank])

        # In order of arrival: the first rank to fail is the cause.
        headline = timeout if late else None
        raise RunFailed(
            failure_message(spec, list(failed), self._status, output, elapsed, headline)
        )

    def _status(self, rank: int) -> str:
        process = self._processes[rank]
        code = process.exitcode
        if code is None:
            return f"still running, pid {process.pid}"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            return f"killed by {name}{hint}, pid {process.pid}"
        return f"exit code {code}, pid {process.pid}"

    def stop(self, kill: bool = False) -> None:
        """End the ranks: politely between tests, at once after a fault or before they were
        ever used (still importing, they would read a polite stop only once ready). Idempotent."""
        polite = not kill and self.ready
        if polite:
            for connection in self._connections:
                with contextlib.suppress(OSError, ValueError):
                    connection.send((STOP, None))
        # Even when killing, a rank that is already exiting gets a moment to finish.
        deadline = time.monotonic() + (STOP_WAIT_S if polite else 0.5 if self.ready else 0.0)
        for process in self._processes:
            process.join(timeout=max(deadline - time.monotonic(), 0.0))
        for process in self._processes:
            if process.is_alive():
                process.terminate()  # SIGTERM first: the rank's faulthandler leaves its stack
        for process in self._processes:
            process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=2.0)
        for connection in self._connections:
            connection.close()
        self._connections = []

    def close(self, kill: bool = False) -> None:
        self.stop(kill=kill or not self.alive)
        self._processes = []
        with contextlib.suppress(OSError):
            for path in self.log_paths:
                path.unlink(missing_ok=True)
            self._log_dir.rmdir()


@contextlib.contextmanager
def _streamed(paths: Sequence[Path], offsets: Sequence[int], live: TextIO | None) -> Iterator[None]:
    """Copies the ranks' new whole lines onto `live` while a test runs (pytest -s), every rank's
    but rank 0's prefixed."""
    if live is None:
        yield
        return
    read_to, done = list(offsets), threading.Event()

    def copy() -> None:
        for rank, path in enumerate(paths):
            try:
                with path.open("rb") as f:
                    f.seek(read_to[rank])
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # whole lines only
            read_to[rank] += end
            text = data[:end].decode(errors="replace")
            if rank:
                text = "".join(f"[rank {rank}] {line}" for line in text.splitlines(True))
            live.write(text)
            live.flush()

    def loop() -> None:
        while not done.wait(STREAM_POLL_S):
            copy()
        copy()

    thread = threading.Thread(target=loop, name="distperf-output", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5.0)


def _surroundings() -> tuple[str, tuple[tuple[str, str], ...]]:
    """What spawned ranks inherit: the directory and environment (less PYTEST_CURRENT_TEST)."""
    environ = tuple(sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"))
    return os.getcwd(), environ


class Pools:
    """The session's pools, one per PoolKey, one alive at a time (never two on the same GPUs)."""

    def __init__(self) -> None:
        self.current: RankPool | None = None
        self.last_output: dict[int, str] = {}

    def start(self, key: PoolKey) -> None:
        """Start the ranks of `key` now; the first test that needs them reports any trouble."""
        with contextlib.suppress(Exception):
            self._pool(key)

    def _pool(self, key: PoolKey) -> RankPool:
        if self.current is None or not self.current.fits(key):
            self.close()
            self.current = RankPool(key)
        return self.current

    def run(
        self,
        spec: RunSpec,
        live: TextIO | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> RunResult:
        spec = replace(spec, threads_per_rank=rank_threads(spec.platform, spec.devices))
        try:
            pool = self._pool(PoolKey.for_ranks(spec.accelerator, spec.devices))
        except Exception as error:  # spawn trouble: still this test's failure
            why = f"{type(error).__name__}: {error}"
            raise RunFailed(f"distperf: could not start the ranks {where(spec)}: {why}") from error
        try:
            return pool.run(spec, live, progress)
        except RunFailed:
            self.close()  # poisoned: the next test gets a new pool
            raise
        except BaseException:  # Ctrl-C, a stopping signal: the session ends, the ranks now
            self.close(kill=True)
            raise
        finally:
            self.last_output = pool.last_output

    def close(self, kill: bool = False) -> None:
        if self.current is not None:
            self.current.close(kill=kill)
            self.current = None
