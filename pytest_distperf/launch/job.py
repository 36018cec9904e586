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
    """This pytest process is one rank of a job torchrun (or srun with the same variables)
    already started: every rank runs the same tests in the same order."""

    rank: int
    world_size: int
    local_world_size: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)


def launched_job(environ: Mapping[str, str] = os.environ) -> LaunchedJob | None:
    """The job this process belongs to, from torchrun's variables; None when there is none."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        local = int(environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        raise ValueError(
            f"RANK={environ['RANK']!r} / WORLD_SIZE={environ['WORLD_SIZE']!r} / "
            f"LOCAL_WORLD_SIZE={environ.get('LOCAL_WORLD_SIZE')!r} in the environment are not "
            "integers"
        ) from None
    return LaunchedJob(rank, world, local)


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
