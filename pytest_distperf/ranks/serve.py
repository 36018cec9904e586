"""The rank side of the pool: join the process group once, then run one RunSpec per message.
Rank 0's TCPStore port, picked by the kernel, is relayed by the pytest process (no race)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any
from unittest import mock

from pytest_distperf.platform import Platform, platform_of
from pytest_distperf.ranks import allocator
from pytest_distperf.ranks.fabric import fabric_module

if TYPE_CHECKING:
    from pytest_distperf.spec import RunSpec

# Messages, pytest process -> rank: ("run", RunSpec) or ("stop", None).
# Rank -> pytest process: ("ready", None), ("done", RankResult) or ("raised", traceback text);
# during a run rank 0 may also send ("progress", text), any number of times before its reply.
# At start rank 0 sends ("store", port) before its "ready"; the pytest process sends it on to
# every other rank, which waits for it before it joins the group.
RUN, STOP, READY, DONE, RAISED = "run", "stop", "ready", "done", "raised"
PROGRESS, STORE = "progress", "store"
STORE_TIMEOUT_S = 300.0  # a rank's wait for the others to reach the store

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of a pool sits and how it reaches the others."""

    rank: int
    world_size: int
    accelerator: str  # "cpu" or "cuda"
    log_path: str  # this rank's stdout and stderr go here
    threads: int  # CPU threads for this rank (CPU ranks share the host's cores)
    parent_pid: int  # the pytest process
    environ: tuple[tuple[str, str], ...] = ()  # extra variables (the pool's comm environment)


def serve(place: RankPlace, connection: Connection) -> None:
    """Entry point of a pool rank (module level: the spawn start method pickles it)."""
    _die_with_parent(place.parent_pid)
    _redirect_output(place.log_path)
    # Ctrl-C reaches the whole foreground process group; the pytest process alone decides
    # what an interrupt stops, so ranks ignore it (and the terminal's hang-up and quit keys).
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    os.environ.update(_rank_environment(place))
    platform = platform_of(place.accelerator)
    if not platform.allocator_memory:
        allocator.keep_heap()  # before torch and gloo start their threads
    try:
        _join_group(place, connection)
    except BaseException:
        connection.send((RAISED, traceback.format_exc()))
        _exit(1)
    connection.send((READY, None))
    from pytest_distperf.ranks.worker import run_rank

    def progress(text: str) -> None:
        connection.send((PROGRESS, text))

    while True:
        try:
            kind, spec = connection.recv()
        except EOFError:  # the pytest process is gone
            _exit(0)
        if kind == STOP:
            # Nothing is left to finish: an interpreter shutdown would only tear down torch and
            # the process group, slowly, while the pytest process waits for it.
            _exit(0)
        try:
            began = time.perf_counter()
            spec, calibration = _calibrate_first(spec, place)
            start = time.perf_counter()
            reporter = progress if place.rank == 0 else None
            with _settings_of_one_test():
                result = run_rank(spec, reporter)
            # Plain strings: torch's version string is a str subclass whose unpickling would
            # import torch into the pytest process.
            versions = {name: str(version) for name, version in result.versions.items()}
            result = replace(result, versions=versions, work_s=time.perf_counter() - start)
            if calibration is not None:  # the pool's, before the test: its phase all the same
                phase_s = dict(result.phase_s)
                phase_s["calibrate"] = phase_s.get("calibrate", 0.0) + start - began
                result = replace(result, calibration=calibration, phase_s=phase_s)
            # Inside the try: a CUDA error left pending by the test surfaces in its synchronize.
            _free_test_state(platform)
        except BaseException:
            connection.send((RAISED, traceback.format_exc()))
            # The group's state is unknown now: this pool is done. No interpreter shutdown,
            # which could wait on a collective that will never complete.
            _exit(1)
        connection.send((DONE, result))


def _calibrate_first(spec: RunSpec, place: RankPlace) -> tuple[RunSpec, Any]:
    """(the spec left to run, the pool's calibration), calibrated before the test, whose buffers
    and time it would be otherwise (a builder's is the test's, once built)."""
    sizes = spec.calibration_sizes
    if sizes is None or spec.calibrate_model:
        return spec, None
    import faulthandler

    from pytest_distperf.ranks.calibrate import calibrate
    from pytest_distperf.ranks.context import DTYPES
    from pytest_distperf.ranks.environment import rank_device

    platform = platform_of(place.accelerator)
    device = rank_device(platform)  # LOCAL_RANK is the pool rank's
    if not platform.allocator_memory:
        allocator.fault_in_heap(allocator.CALIBRATION_PAD)  # the next test's reset gives it back
    # The test's own watchdog (worker.run_rank) starts after this one.
    faulthandler.dump_traceback_later(spec.timeout, exit=True, file=sys.stderr)
    dtype = DTYPES[spec.workload.precision]
    try:
        calibration = calibrate(
            sizes.all_gather, sizes.all_reduce, device, dtype, sizes_p2p=sizes.p2p
        )
    finally:
        faulthandler.cancel_dump_traceback_later()
    return replace(spec, calibration_sizes=None), calibration


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank_environment(place: RankPlace) -> dict[str, str]:
    threads = str(place.threads)
    return {
        "RANK": str(place.rank),
        "LOCAL_RANK": str(place.rank),
        "GROUP_RANK": "0",
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_WORLD_SIZE": str(place.world_size),
        "MASTER_ADDR": "127.0.0.1",
        # The store exists before anything could rendezvous through env://: anything that does
        # must join it as a client (torch elastic's agent-store mode), never host a second one.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        # Fabric takes ranks from the first cluster it detects, TorchElastic before SLURM: without
        # this, inside a SLURM allocation every pool rank would be SLURM_PROCID's rank.
        "TORCHELASTIC_RUN_ID": "distperf-pool",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        **dict(place.environ),
    }


def _join_group(place: RankPlace, connection: Connection) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from pytest_distperf.ranks.environment import rank_device

    timeout = timedelta(seconds=STORE_TIMEOUT_S)
    if place.rank == 0:
        store = dist.TCPStore(
            "127.0.0.1", 0, place.world_size, is_master=True, timeout=timeout,
            wait_for_workers=False,
        )  # fmt: skip
        connection.send((STORE, store.port))
    # Imported now, once, so that the first test does not pay for it; the other ranks import it
    # while rank 0's port is on its way to them.
    fabric_module()

    if place.rank != 0:
        kind, port = connection.recv()
        if kind == STOP:  # the pool was closed before it was ever used
            _exit(0)
        if kind != STORE:
            raise RuntimeError(f"expected the store's port from the pytest process, got {kind!r}")
        store = dist.TCPStore("127.0.0.1", port, place.world_size, is_master=False, timeout=timeout)
    os.environ["MASTER_PORT"] = str(store.port)  # for whatever reads the rendezvous variables
    platform = platform_of(place.accelerator)
    device = rank_device(platform) if platform.gpus else None  # LOCAL_RANK is the pool rank's
    if device is not None:
        torch.cuda.set_device(device)
    if platform.shares_cores:
        torch.set_num_threads(place.threads)
    dist.init_process_group(
        platform.backend, store=store, rank=place.rank, world_size=place.world_size,
        device_id=device,
    )  # fmt: skip
    _reuse_device_meshes()


def _reuse_device_meshes() -> None:
    """One DeviceMesh per shape for every test of the pool: Fabric's ModelParallelStrategy makes
    a new one per test, whose process groups live until the process ends."""
    model_parallel = fabric_module("strategies.model_parallel")

    build = model_parallel._setup_device_mesh
    meshes: dict[tuple[int, int, int, str], object] = {}

    def cached(data_parallel: int, tensor_parallel: int, world_size: int, device: object) -> object:
        key = (data_parallel, tensor_parallel, world_size, str(getattr(device, "type", device)))
        if key not in meshes:
            meshes[key] = build(data_parallel, tensor_parallel, world_size, device)
        return meshes[key]

    model_parallel._setup_device_mesh = cached


@contextlib.contextmanager
def _settings_of_one_test() -> Iterator[None]:
    """A test's changes to torch's process-wide settings and to the environment end with it: a
    builder that sets TF32 matmuls or a default dtype must not change the next test's run."""
    import torch

    dtype, precision = torch.get_default_dtype(), torch.get_float32_matmul_precision()
    deterministic, grad = torch.are_deterministic_algorithms_enabled(), torch.is_grad_enabled()
    try:
        with mock.patch.dict(os.environ):
            yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_float32_matmul_precision(precision)
        torch.use_deterministic_algorithms(deterministic)
        torch.set_grad_enabled(grad)


def _free_test_state(platform: Platform) -> None:
    """Drop what the test left: cycles (modules hold hooks), cached allocator blocks, the freed
    heap glibc keeps (the next test's peak starts where a fresh rank's would)."""
    import gc

    gc.collect()
    if platform.allocator_memory:
        import torch

        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    else:
        allocator.release_heap()


def _die_with_parent(parent_pid: int) -> None:
    # Whatever ends the pytest process (SIGKILL included), its ranks must not outlive it.
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _redirect_output(path: str) -> None:
    # At the file-descriptor level, so that C++ (gloo, NCCL, faulthandler) writes land there too.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
