"""Job mode: pytest itself is one rank of a job that torchrun or SLURM already started.

Every rank runs the same tests in the same order; the job's process group is the test's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_distperf.spec import RankResult, RunResult, RunSpec


@dataclass(frozen=True)
class LaunchedJob:
    """This pytest process is one rank of a job torchrun or srun already started: every rank
    runs the same tests in the same order."""

    rank: int
    world_size: int
    local_world_size: int
    local_rank: int = 0
    launcher: str = "torchrun"  # or "srun"

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    def environment(self) -> dict[str, str]:
        """torchrun's variables, which torch.distributed's env:// rendezvous reads; under srun
        they are derived from SLURM's, so that both jobs join the same way."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }


SRUN_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT")


def launched_job(environ: Mapping[str, str] = os.environ) -> LaunchedJob | None:
    """The job this process belongs to, from torchrun's variables, or from srun's (with
    MASTER_ADDR and MASTER_PORT, which a SLURM script exports); None when there is none."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        names = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK")
        rank, world = _integers(environ, names[:2])
        local_world = _integers(environ, names[2:3], default=world)[0]
        local_rank = _integers(environ, names[3:], default=rank % max(local_world, 1))[0]
        return LaunchedJob(rank, world, local_world, local_rank)
    # MASTER_ADDR/PORT too: an interactive salloc shell has SLURM_PROCID but is not a job.
    if all(environ.get(name) for name in SRUN_VARIABLES):
        rank, world = _integers(environ, ("SLURM_PROCID", "SLURM_NTASKS"))
        local_rank = _integers(environ, ("SLURM_LOCALID",), default=0)[0]
        per_node = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
        local_world = world
        if per_node:  # SLURM writes e.g. "2(x3)": 2 tasks on each of 3 nodes
            local_world = _integers(
                {"tasks per node": per_node.split("(")[0]}, ("tasks per node",)
            )[0]
        return LaunchedJob(rank, world, local_world, local_rank, launcher="srun")
    return None


def _integers(
    environ: Mapping[str, str], names: tuple[str, ...], default: int | None = None
) -> list[int]:
    values = []
    for name in names:
        raw = environ.get(name)
        if raw in (None, "") and default is not None:
            values.append(default)
            continue
        try:
            values.append(int(str(raw)))
        except ValueError:
            shown = " / ".join(f"{n}={environ.get(n)!r}" for n in names)
            raise ValueError(f"{shown} in the environment: not integers") from None
    return values


def run_in_job(spec: RunSpec) -> RunResult:
    """Run `spec` in this process as its rank of the launched job; every rank gets every
    rank's result. A failing or hung rank stops the whole job (the job launcher's business)."""
    import torch.distributed as dist

    from pytest_distperf.ranks.worker import run_rank

    launched_at, start = time.time(), time.perf_counter()
    mine = run_rank(spec)
    everyone: list[RankResult | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    ranks = tuple(sorted((r for r in everyone if r is not None), key=lambda r: r.rank))
    return RunResult(spec, ranks, time.perf_counter() - start, launched_at)
