"""Fresh ranks for one run through torch's elastic launcher (torchrun's machinery): spawned
processes, a loopback rendezvous on a free port, no restarts, a log per rank for the message."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

from pytest_distperf.launch.failures import (
    RunFailed,
    failure_message,
    output_tail,
    timeout_headline,
    where,
)
from pytest_distperf.launch.pool import rank_threads
from pytest_distperf.launch.signals import HANDLED_SIGNALS, own_signals, session_stop
from pytest_distperf.measured import RankResult, RunResult
from pytest_distperf.spec import RunSpec


def launch(spec: RunSpec) -> RunResult:
    """Run `spec` in `spec.devices` fresh ranks; raise RunFailed with the reason if any fails."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from pytest_distperf.ranks.worker import run_rank

    spec = replace(spec, threads_per_rank=rank_threads(spec.platform, spec.devices))
    binding = numa_options(spec)  # before anything is created: a bad setting fails cleanly
    log_dir = Path(tempfile.mkdtemp(prefix="distperf-"))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=spec.devices,
        run_id=f"distperf-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # port 0: the store picks a free port, no clashes
        max_restarts=0,
        monitor_interval=0.05,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL),
        numa_options=binding,
    )
    threads = str(spec.threads_per_rank)
    # Spawned ranks inherit the parent's environment at start; it is restored afterwards.
    inherited = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    launched_at, start = time.time(), time.perf_counter()
    signals: set[int] = set()
    try:
        with mock.patch.dict(os.environ, inherited), own_signals(signals):
            returned: dict[int, RankResult] = elastic_launch(config, run_rank)(spec)
    except ChildFailedError as error:
        # A terminal's Ctrl-C reaches the ranks too; when they stop before the agent's own
        # handler acts, the run ends as a rank failure, but it is still the user's interrupt.
        noted = [signum for signum in HANDLED_SIGNALS if signum in signals]  # SIGINT first
        if noted:
            raise session_stop(noted[0]) from None
        elapsed = time.perf_counter() - start
        raise RunFailed(_describe_failure(spec, error, log_dir, elapsed)) from None
    except SignalException as error:  # the agent stopped the ranks; the session stops too
        raise session_stop(error.sigval) from None
    except Exception as error:  # rendezvous, store or spawn trouble: still this test's failure
        raise RunFailed(
            f"distperf: could not run the ranks {where(spec)}: {type(error).__name__}: {error}"
        ) from error
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    elapsed = time.perf_counter() - start
    ranks = tuple(returned[rank] for rank in sorted(returned))
    return RunResult(spec=spec, ranks=ranks, launch_s=elapsed, launched_at=launched_at)


def numa_options(spec: RunSpec) -> Any:
    """torch's NUMA binding for the ranks (`torch.numa.binding.NumaOptions`), or None."""
    if spec.numa_binding is None:
        return None
    if not spec.platform.gpus:
        raise RunFailed(
            f"distperf: --distperf-numa-binding={spec.numa_binding} binds each rank to the CPUs "
            f"near its GPU; these ranks run on {spec.accelerator}"
        )
    try:
        from torch.numa.binding import AffinityMode, NumaOptions
    except ImportError:
        import torch

        raise RunFailed(
            f"distperf: --distperf-numa-binding needs torch's NUMA binding (torch.numa.binding), "
            f"which torch {torch.__version__} does not have"
        ) from None
    return NumaOptions(affinity_mode=AffinityMode(spec.numa_binding))


def _describe_failure(spec: RunSpec, error: Any, log_dir: Path, elapsed: float) -> str:
    failures = error.failures  # rank -> torch's ProcessFailure
    timed_out = elapsed >= spec.timeout

    def status(rank: int) -> str:
        failure = failures.get(rank)
        if failure is None:
            return "stopped by the launcher"
        return f"exit code {failure.exitcode}, pid {failure.pid}"

    def output(rank: int) -> str:
        text = "" if timed_out or rank not in failures else _traceback(failures[rank].message)
        files = sorted(log_dir.glob(f"**/{rank}/stderr.log"))
        return text or (output_tail(files[-1]) if files else "")

    first = sorted(failures, key=lambda rank: (failures[rank].timestamp, rank))
    timeout = timeout_headline(spec) if timed_out else None
    return failure_message(spec, first, status, output, elapsed, timeout)


def _traceback(message: object) -> str:
    """A failed rank's traceback from its error file's message (a dict where torch recorded it)."""
    if isinstance(message, dict):
        return str(message.get("extraInfo", {}).get("py_callstack") or message.get("message", ""))
    return str(message or "")
