"""A launched job's process group from one test to the next (every rank runs the same tests):
the job's store is joined once, and after a failed run the next test forms a new group on it."""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from pytest_distperf.measured import RankResult
from pytest_distperf.ranks import environment
from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.jobwatch import Fault, RunWatch
from pytest_distperf.ranks.worker import run_rank
from pytest_distperf.spec import RunSpec


class JobRunFailed(Exception):
    """The run failed in some rank, hence in every rank: `first` is its cause, `hung` where the
    deadline found the ranks it pulled out of their own code."""

    def __init__(self, first: Fault, hung: list[Fault]) -> None:
        super().__init__(first.text)
        self.first, self.hung = first, hung


class JobGroup:
    """The job's store, this rank's place in the job, and the default group's generation."""

    def __init__(self) -> None:
        # Before any group exists: torch.distributed.nn, which Fabric imports, takes the group of
        # the day as its functions' default argument, and a group held so never closes.
        fabric_module()
        store, self.rank, self.world = next(dist.rendezvous("env://"))
        self.store = dist.PrefixStore("distperf/", store)
        self.generation = 0
        self.runs = 0

    def join(self, spec: RunSpec) -> None:
        """The default group of this generation, unless this rank is in it already."""
        group_store = dist.PrefixStore(f"group{self.generation}/", self.store)
        device = environment.rank_device(spec.platform)
        environment.join_group(device, group_store, self.rank, self.world)

    def leave_group(self, error: BaseException | None) -> None:
        """Leave the default group after a failed run, so a peer blocked in a collective gets an
        error; `error`'s frames (the model, its wrapper, the group) let go first, or gloo waits."""
        for _ in range(16):  # the chain of exceptions it came with, which Python keeps acyclic
            if error is None:
                break
            traceback.clear_frames(error.__traceback__)
            error = error.__context__
        gc.collect()  # what held the group in a reference cycle
        if dist.is_initialized():
            if dist.get_backend() == "nccl":  # a destroy could wait on work that never ends
                dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
        self.generation += 1

    def board(self) -> dist.Store:
        """The next run's board: every rank counts its runs alike."""
        self.runs += 1
        return dist.PrefixStore(f"run{self.runs}/", self.store)

    def leave(self, timeout_s: float) -> None:
        """Wait, at most `timeout_s`, until every rank has finished its session: one that exits
        first makes its launcher stop the others, maybe before rank 0 has reported."""
        if self.store.add("left", 1) >= self.world:
            self.store.set("all-left", "1")
        # A rank that died, or (srun) rank 0's store gone once it left: nothing more to wait for.
        with contextlib.suppress(dist.DistError):
            self.store.wait(["all-left"], timedelta(seconds=timeout_s))


_GROUP: list[JobGroup] = []  # this process's, from its first run on


def run_in_group(spec: RunSpec, notice: Callable[[], None] | None = None) -> tuple[RankResult, ...]:
    """Run `spec` as this rank of the job: every rank's result, in rank order. A failure in any
    rank raises JobRunFailed in all; a Ctrl-C or signal as it came, once the peers know."""
    if not _GROUP:
        _GROUP.append(JobGroup())
    group = _GROUP[0]
    watch = RunWatch(group.board(), group.rank, group.world, spec.timeout, notice)
    start = time.perf_counter()
    error: BaseException | None = None
    try:
        ranks = watch.run(lambda: _run(group, spec))
        if not watch.failed_elsewhere():
            return ranks
    except BaseException as caught:  # noqa: BLE001 - every rank must hear of any end of a run
        watch.finish()  # the run's interrupt may have come inside the first call
        error = caught
    try:
        first, hung = watch.settle(error, time.perf_counter() - start)
    finally:  # whatever the store said: peers waiting on this rank must not wait on
        group.leave_group(error)
    if error is not None and not isinstance(error, Exception):
        raise error
    raise JobRunFailed(first, hung)


def _run(group: JobGroup, spec: RunSpec) -> tuple[RankResult, ...]:
    group.join(spec)
    mine = run_rank(spec, deadline=False)
    everyone: list[RankResult | None] = [None] * group.world
    dist.all_gather_object(everyone, mine)
    return tuple(sorted((r for r in everyone if r is not None), key=lambda r: r.rank))


def leave(timeout_s: float) -> None:
    """The end of this rank's session: see JobGroup.leave (nothing if it ran no test)."""
    if _GROUP:
        _GROUP[0].leave(timeout_s)
