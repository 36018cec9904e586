"""Job mode: pytest itself is one rank of a job that torchrun or SLURM already started; the
job's group is the test's (ranks/jobgroup.py, ranks/jobwatch.py)."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_distperf.launch.failures import RunFailed, failed_headline, rank_section, where
from pytest_distperf.measured import RunResult
from pytest_distperf.spec import RunSpec

if TYPE_CHECKING:
    from pytest_distperf.topology import Topology


# Each launcher's variables for (rank, world size, ranks per node, local rank).
VARIABLES = {
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"),
    "srun": ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_LOCALID"),
}
# MASTER_ADDR/PORT too: an interactive salloc shell has SLURM_PROCID but is not a job.
SRUN_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LaunchedJob:
    """This pytest process is one rank of a job torchrun or srun already started: every rank
    runs the same tests in the same order."""

    rank: int
    world_size: int
    local_world_size: int
    local_rank: int = 0
    launcher: str = "torchrun"  # or "srun"

    def __post_init__(self) -> None:
        rank, world, local_world, local_rank = VARIABLES[self.launcher]
        problems = []
        if self.world_size < 1:
            problems.append(f"{world}={self.world_size} must be >= 1")
        elif not 0 <= self.rank < self.world_size:
            problems.append(f"{rank}={self.rank} must be in [0, {world}={self.world_size})")
        if not 1 <= self.local_world_size <= max(self.world_size, 1):
            problems.append(f"{local_world}={self.local_world_size} must be in [1, {world}]")
        elif not 0 <= self.local_rank < self.local_world_size:
            bound = f"{local_world}={self.local_world_size}"
            problems.append(f"{local_rank}={self.local_rank} must be in [0, {bound})")
        if problems:
            raise ValueError("; ".join(problems) + " (from the environment)")

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    def topology(self, node: Topology) -> Topology:
        """One node's probed topology as this job's: over several nodes it names their count, so
        a job's baselines are never one node's."""
        return replace(node, nodes=self.nodes) if self.nodes > 1 else node

    def environment(self) -> dict[str, str]:
        """torchrun's variables, which env:// reads (under srun derived from SLURM's)."""
        values = (self.rank, self.world_size, self.local_world_size, self.local_rank)
        return {name: str(value) for name, value in zip(VARIABLES["torchrun"], values, strict=True)}


def launched_job(environ: Mapping[str, str] = os.environ) -> LaunchedJob | None:
    """The job this process belongs to, from torchrun's variables or srun's; None if none."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        names = VARIABLES["torchrun"]
        rank, world = _integers(environ, names[:2])
        local_world = _integers(environ, names[2:3], default=world)[0]
        local_rank = _integers(environ, names[3:], default=rank % max(local_world, 1))[0]
        return LaunchedJob(rank, world, local_world, local_rank)
    if not all(environ.get(name) for name in SRUN_VARIABLES):
        return None
    rank, world = _integers(environ, SRUN_VARIABLES[:2])
    local_rank = _integers(environ, ("SLURM_LOCALID",), default=0)[0]
    local_world = world
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        per_node = environ.get(name)
        if per_node:
            # SLURM writes e.g. "2(x3)": 2 tasks on each of 3 nodes; "2,1" is an uneven layout
            if not re.fullmatch(r"\d+(\(x\d+\))?", per_node):
                raise ValueError(
                    f"{name}={per_node!r} in the environment: distperf needs the same number "
                    "of tasks on every node, e.g. '4' or '4(x2)'"
                )
            local_world = int(per_node.split("(")[0])
            break
    return LaunchedJob(rank, world, local_world, local_rank, "srun")


def _integers(
    environ: Mapping[str, str], names: tuple[str, ...], default: int | None = None
) -> list[int]:
    try:  # a variable unset or empty takes `default`: int(None) raises TypeError
        return [int(environ.get(name) or default) for name in names]  # type: ignore[arg-type]
    except (TypeError, ValueError):
        shown = " / ".join(f"{n}={environ.get(n)!r}" for n in names)
        raise ValueError(f"{shown} in the environment: not integers") from None


def run_in_job(spec: RunSpec, notice: Callable[[str], None] | None = None) -> RunResult:
    """Run `spec` as this rank of the job: every rank's result. A run that fails in one rank
    fails in all with its error; a timeout ends the job. `notice`: rank 0's `notice_writer`."""
    from pytest_distperf.ranks.jobgroup import JobRunFailed, run_in_group

    launched_at, start = time.time(), time.perf_counter()
    said = None if notice is None else lambda: notice(job_stop_line(spec))
    try:
        ranks = run_in_group(spec, said)  # joins the job's group, a group of one included
    except JobRunFailed as failed:
        raise _run_failed(spec, failed) from None
    return RunResult(spec, ranks, time.perf_counter() - start, launched_at)


def _run_failed(spec: RunSpec, failed: Any) -> RunFailed:
    """What every rank's test says when the run failed in any rank (`failed`: JobRunFailed)."""
    from pytest_distperf.ranks.jobwatch import STOPPED, TIMEOUT

    first = failed.first
    if first.kind == TIMEOUT:
        lines = [
            f"distperf: still running after --distperf-timeout={spec.timeout:g} s {where(spec)}: "
            "the job stops here; each rank wrote the stacks of its threads to its stderr (in its "
            "report of this test: captured stderr)"
        ]
        lines += [rank_section(f.rank, "where the timeout found it", f.text) for f in failed.hung]
        return RunFailed("\n".join(lines), stops=job_stop_line(spec))
    section = rank_section(first.rank, first.kind, first.text)
    if first.kind == STOPPED:
        return RunFailed(job_stop_line(spec, first.rank) + section, job_stop_line(spec, first.rank))
    return RunFailed(failed_headline(spec, first.rank, first.elapsed_s) + section)


def job_stop_line(spec: RunSpec, rank: int | None = None) -> str:
    """Why a launched job ends at this test: its timeout, or rank `rank`'s session stopped."""
    if rank is None:
        why = f"ran past --distperf-timeout={spec.timeout:g} s"
    else:
        why = f"was stopped in rank {rank} (Ctrl-C or a signal)"
    return f"distperf: the job stops: {spec.test_id} {why}"


def notice_writer(config: Any) -> Callable[[str], None] | None:
    """Rank 0's way to say why the job stops when its test never comes back to report it:
    straight to the terminal (call it from pytest_configure, while fd 1 is still that)."""
    try:
        fd = os.dup(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (an in-process session)
        return None

    def write(line: str) -> None:
        stats = getattr(config.pluginmanager.get_plugin("terminalreporter"), "stats", {})
        counts = [f"{len(stats[k])} {k}" for k in ("passed", "failed", "error") if stats.get(k)]
        os.write(fd, f"\n{line}; before it: {', '.join(counts) or 'no test'}\n".encode())

    return write


LEAVE_S = 30.0  # how long a rank waits for the others at the end of its session


def leave_job() -> None:
    """The end of this rank's session: wait for every rank to reach it (ranks/jobgroup.py)."""
    jobgroup = sys.modules.get("pytest_distperf.ranks.jobgroup")  # never imported: no test ran
    if jobgroup is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        jobgroup.leave(LEAVE_S)
