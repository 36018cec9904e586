"""A run in a launched job, watched from beside it (ranks/jobwatch.py), in this process: the
board lives in a store this test hosts, and "another rank" is a second watch on that board. What
a failed run then says in every rank (launch/job.py). Ranks for real: tests/test_jobs.py."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from pytest_distperf.launch.job import _run_failed
from pytest_distperf.ranks.jobgroup import JobRunFailed
from pytest_distperf.ranks.jobwatch import (
    DONE,
    INTERRUPT_SIGNAL,
    RAISED,
    STOPPED,
    TIMEOUT,
    Fault,
    Interrupted,
    RunWatch,
)
from pytest_distperf.spec import RunSpec, Workload


@pytest.fixture
def board() -> Iterator[dist.Store]:
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
    yield dist.PrefixStore("run1/", store)


def _stuck_in_its_own_code() -> None:
    time.sleep(30)


def test_a_run_that_returns_leaves_nothing_behind(board: dist.Store) -> None:
    before = signal.getsignal(INTERRUPT_SIGNAL)
    watch = RunWatch(board, rank=0, world=2, timeout=30)
    assert watch.run(lambda: 42) == 42
    assert not watch.failed_elsewhere() and watch.stopped is None
    assert signal.getsignal(INTERRUPT_SIGNAL) == before
    assert board.get("wake/0").decode() == DONE
    assert not board.check(["wake/1"])  # nothing to tell the other rank


def test_another_ranks_failure_pulls_this_rank_out_of_its_code(board: dist.Store) -> None:
    peer = RunWatch(board, rank=1, world=2, timeout=30)
    fault = Fault(1, RAISED, "ValueError: boom on rank 1", 0.5)
    threading.Timer(0.2, peer.publish, (fault, board)).start()
    watch = RunWatch(board, rank=0, world=2, timeout=30)
    start = time.monotonic()
    with pytest.raises(Interrupted) as caught:
        watch.run(_stuck_in_its_own_code)
    watch.finish()
    assert time.monotonic() - start < 10
    assert caught.value.kind == RAISED and watch.stopped == RAISED
    first, hung = watch.settle(caught.value, 1.0)
    assert first == fault and hung == []  # the cause is rank 1's, not this rank's interruption


def test_the_deadline_stops_the_run_and_says_where_it_was(board: dist.Store) -> None:
    watch = RunWatch(board, rank=0, world=2, timeout=0.5)
    with pytest.raises(Interrupted) as caught:
        watch.run(_stuck_in_its_own_code)
    watch.finish()
    assert caught.value.kind == TIMEOUT
    assert board.get("wake/1").decode() == TIMEOUT  # the other rank is told at once
    first, [hung] = watch.settle(caught.value, 0.5)
    assert first.kind == TIMEOUT and "--distperf-timeout=0.5 s" in first.text
    assert hung.rank == 0 and "_stuck_in_its_own_code" in hung.text


def test_the_first_failure_is_the_cause_for_every_rank(board: dist.Store) -> None:
    one, two = (RunWatch(board, rank=r, world=3, timeout=30) for r in (1, 2))
    first = Fault(1, RAISED, "ValueError: first", 0.1)
    assert one.publish(first, board) == first
    assert two.publish(Fault(2, RAISED, "RuntimeError: Connection closed", 0.2), board) == first
    assert {board.get(f"wake/{r}").decode() for r in (0, 2)} == {RAISED}
    assert not board.check(["wake/1"])


def _spec() -> RunSpec:
    return RunSpec("test_x.py::test_x[auto-2cpu]", "auto", 2, "cpu", Workload(), 2, 1, 120.0)


def test_what_a_failed_run_says_in_every_rank() -> None:
    raised = _run_failed(_spec(), JobRunFailed(Fault(1, RAISED, "ValueError: boom", 0.8), []))
    assert str(raised).startswith("distperf: rank 1 of 2 failed after 0.8 s [auto, 2 cpu ranks")
    assert "--- rank 1 (raised) ---\nValueError: boom" in str(raised)
    assert raised.stops is None  # the next test runs

    hung = Fault(1, TIMEOUT, 'File "builders.py", line 3, in hanging', 120.0)
    timeout = Fault(0, TIMEOUT, "still running after --distperf-timeout=120 s", 120.0)
    timed_out = _run_failed(_spec(), JobRunFailed(timeout, [hung]))
    assert "still running after --distperf-timeout=120 s" in str(timed_out)
    assert "--- rank 1 (where the timeout found it) ---" in str(timed_out)
    assert timed_out.stops == (
        "distperf: the job stops: test_x.py::test_x[auto-2cpu] ran past --distperf-timeout=120 s"
    )

    stopped = _run_failed(_spec(), JobRunFailed(Fault(1, STOPPED, "KeyboardInterrupt", 3.0), []))
    assert stopped.stops is not None and "stopped in rank 1" in stopped.stops
