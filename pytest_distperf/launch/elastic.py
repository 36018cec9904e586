"""Start N ranks through torch's elastic launcher (the machinery behind torchrun), collect their
results, and turn failures and hangs into one readable message.

Each run gets fresh processes (spawn), a loopback c10d rendezvous on a free port, no restarts,
and per-rank stdout/stderr files, so a hung rank's stack dump can be shown to the user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_distperf.spec import RankResult, RunResult, RunSpec

STDERR_TAIL_LINES = 60


class RunFailed(Exception):
    """One or more ranks failed or hung; the message is meant for the user as is."""


class SessionStopped(BaseException):
    """A signal (SIGTERM from a CI runner's cancel, SIGHUP, SIGQUIT) asked the whole session to
    stop, not just this test: a BaseException, so that nothing on the way mistakes it for a
    test's failure and goes on to the next test."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(devices: int, cpus: int | None = None) -> int:
    # Ranks share the cores: give each an equal share (at least one) so N ranks never ask for
    # N x all cores, which makes every rank slower and the figures meaningless.
    return max(1, (cpus or available_cpus()) // devices)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    # Spawned ranks inherit the parent's environment at start; restore it afterwards.
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


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


def launch(spec: RunSpec) -> RunResult:
    """Run `spec` in `spec.devices` fresh ranks; raise RunFailed with the reason if any fails."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from pytest_distperf.ranks.worker import run_rank

    if spec.accelerator == "cpu":
        spec = replace(spec, threads_per_rank=threads_per_rank(spec.devices))
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
    launched_at = time.time()
    start = time.perf_counter()
    signals: set[int] = set()
    try:
        with _environment(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads), _own_signals(signals):
            returned: dict[int, RankResult] = elastic_launch(config, run_rank)(spec)
    except ChildFailedError as error:
        # A terminal's Ctrl-C reaches the ranks too; when they stop before the agent's own
        # handler acts, the run ends as a rank failure, but it is still the user's interrupt.
        if signal.SIGINT in signals:
            raise KeyboardInterrupt from None
        for stop in STOPPING_SIGNALS & signals:
            raise SessionStopped(stop) from None
        elapsed = time.perf_counter() - start
        raise RunFailed(_describe_failure(spec, error, log_dir, elapsed)) from None
    except SignalException as error:
        # The elastic agent has already stopped the ranks; the signal must still stop the
        # pytest session rather than fail one test and go on to the next.
        if error.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise SessionStopped(error.sigval) from None
    except Exception as error:  # rendezvous, store or spawn trouble: still this test's failure
        where = f"[{spec.strategy}, {spec.devices} {spec.accelerator} ranks, {spec.test_id}]"
        raise RunFailed(
            f"distperf: could not run the ranks {where}: {type(error).__name__}: {error}"
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
    if spec.accelerator != "cuda":
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


HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
STOPPING_SIGNALS = frozenset(HANDLED_SIGNALS) - {signal.SIGINT}  # SIGINT: KeyboardInterrupt


@contextlib.contextmanager
def _own_signals(signals: set[int] | None = None) -> Iterator[None]:
    """Give pytest its signal handlers back: the elastic agent installs its own for the run and
    leaves them, after which a Ctrl-C between tests would only fail the next test.

    Also notes every signal that arrives meanwhile in `signals`, through Python's wakeup fd,
    which is written whichever handler is installed (the agent replaces the handlers).
    """
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


def _describe_failure(spec: RunSpec, error: object, log_dir: Path, elapsed: float) -> str:
    failures = getattr(error, "failures", {})
    timed_out = elapsed >= spec.timeout
    where = f"[{spec.strategy}, {spec.devices} {spec.accelerator} ranks, {spec.test_id}]"
    lines: list[str] = []
    if timed_out:
        lines.append(
            f"distperf: ranks still running after --distperf-timeout={spec.timeout:g} s were "
            f"stopped {where}; stack dumps of the hung ranks follow."
        )
    else:
        ranks = ", ".join(str(r) for r in sorted(failures))
        lines.append(
            f"distperf: rank {ranks} of {spec.devices} failed after {elapsed:.1f} s {where}"
        )
    # On a timeout every rank's stack matters (who waits for whom); otherwise the failed ones.
    ranks_to_show = range(spec.devices) if timed_out else sorted(failures)
    for rank in ranks_to_show:
        failure = failures.get(rank)
        status = "stopped by the launcher"
        if failure is not None:
            status = f"exit code {failure.exitcode}, pid {failure.pid}"
        lines.append("")
        lines.append(f"--- rank {rank} ({status}) ---")
        traceback = _traceback(failure) if failure is not None else ""
        if traceback and not timed_out:
            lines.append(traceback.rstrip())
        else:
            lines.append(_stderr_tail(log_dir, rank) or "(no output captured)")
    return "\n".join(lines)


def _traceback(failure: object) -> str:
    data = getattr(failure, "error_file_data", None) or {}
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        callstack = message.get("extraInfo", {}).get("py_callstack")
        if callstack:
            return str(callstack)
        return str(message.get("message", ""))
    return str(getattr(failure, "message", "") or "")


def _stderr_tail(log_dir: Path, local_rank: int) -> str:
    files = sorted(log_dir.glob(f"**/{local_rank}/stderr.log"))
    if not files:
        return ""
    text = files[-1].read_text(errors="replace").splitlines()
    return "\n".join(text[-STDERR_TAIL_LINES:])
