"""What many test modules share: free ports, spawned gloo ranks, the processes a test left
behind, model builders that fail on purpose, and a launcher faked for plugin tests whose point
is not the ranks. Importable from test modules and from the pytest sessions they run."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import socket
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
TAG_VARIABLE = "DISTPERF_TEST_TAG"  # ranks inherit it: their pids can be found from it
# Set by conftest.py for the suite: the pytest cache its sessions share, so that only the first
# session of a rank count calibrates its collectives (calibrations.py keeps them there).
SHARED_CACHE_VARIABLE = "DISTPERF_TEST_SHARED_CACHE"
SHARED_POOL_VARIABLE = "DISTPERF_TEST_SHARED_POOL"  # the address of tests/shared_pool.py's host


def shared_cache() -> tuple[str, ...]:
    """Arguments that give a pytest session the suite's shared cache (none outside the suite)."""
    directory = os.environ.get(SHARED_CACHE_VARIABLE)
    return ("-o", f"cache_dir={directory}") if directory else ("-p", "no:cacheprovider")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- gloo ranks


def _rank_main(target: Callable[..., Any], rank: int, world: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        value = target(rank, world)
        dist.destroy_process_group()
        out.put((rank, value, None))
    except BaseException:  # noqa: BLE001 - report anything to the parent instead of hanging it
        out.put((rank, None, traceback.format_exc()))
    out.close()
    out.join_thread()  # the answer is in the pipe before this process goes


def spawn_gloo_ranks(
    target: Callable[[int, int], Any], world: int = 2, timeout: float = 120.0
) -> dict[int, Any]:
    """Run `target(rank, world)` in `world` spawned processes joined in one gloo group; its
    return value per rank (picklable, and `target` importable by name). A rank that raises or
    stays silent for `timeout` seconds fails the test with its traceback."""

    from rank_guard import refuse_ranks

    refuse_ranks()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(target, rank, world, port, results))
        for rank in range(world)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        while len(got) < world:
            try:
                rank, value, error = results.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"ranks did not answer in {timeout:.0f} s (got {sorted(got)})")
            if error is not None:
                pytest.fail(f"rank {rank} failed:\n{error}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    return got


def greedy_logits(model: Any) -> list[Any]:
    """Prefill and three greedy decode steps; each step's last logits [B, V] (tensors). The KV
    cache is made here, once the model is split or placed, as the worker makes it: tp's holds
    only this rank's query groups."""
    import torch

    if hasattr(model, "setup_caches"):
        model.setup_caches(2, 16, device=torch.device("cpu"), dtype=torch.float32)
    else:  # LitGPT's GPT
        model.set_kv_cache(batch_size=2, max_seq_length=16)
    prompt = torch.randint(0, 200, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = [model(prompt, torch.arange(5))[:, -1]]
        for step in range(3):
            token = out[-1].argmax(-1, keepdim=True)
            out.append(model(token, torch.tensor([5 + step]))[:, -1])
    return out


# --------------------------------------------------------------------------- leftovers


def processes_tagged(tag: str) -> list[int]:
    """Pids of live processes whose environment carries `tag` (ranks inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"{TAG_VARIABLE}={tag}".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until_gone(tag: str, seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := processes_tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# --------------------------------------------------------------------------- sessions


def threshold_expected(row: dict[str, Any]) -> str:
    """A healthy row's threshold status: judged (and met) where the ranks exchange collectives;
    a note for replicated decode and where the model does not yet hold (UNMODELLED)."""
    from pytest_distperf.judge.threshold import UNMODELLED

    prediction = row["prediction"]
    exchanged = prediction["expected_collectives"] or prediction["counted_collectives"]
    unmodelled = (row["accelerator"], row["strategy"], row["mode"]) in UNMODELLED
    return "ok" if exchanged and not unmodelled else "note"


@dataclass(frozen=True)
class Session:
    """A pytest session run once for many asserts (a module-scoped fixture's value): its
    directory, its outcome and output, and the tagged processes it left behind."""

    path: Path
    result: Any  # pytest.RunResult
    left_behind: tuple[int, ...] = ()

    def rows(self, report: str = "report.json") -> dict[str, dict[str, Any]]:
        """The JSON report's rows by test name, e.g. "test_x[auto-2cpu]"."""
        rows = json.loads((self.path / report).read_text())["results"]
        return {row["test_id"].split("::")[-1]: row for row in rows}

    def output(self) -> str:
        return self.result.stdout.str()

    def assert_outcomes(self, **outcomes: int) -> None:
        """`RunResult.assert_outcomes`, its message carrying the inner session's failures: a
        CI log otherwise shows the counts and not which inner test failed, nor why."""
        try:
            self.result.assert_outcomes(**outcomes)
        except AssertionError as error:
            lines = self.output().splitlines()
            failures = [line for line in lines if line.startswith(("FAILED", "ERROR", "E  "))]
            raise AssertionError(f"{error}\ninner session:\n" + "\n".join(failures[-60:])) from None


def run_session(
    path: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    tag: bool = True,
    pool: str | None = None,
) -> Session:
    """Run pytest in a fresh interpreter in `path` (as pytester.runpytest_subprocess does),
    with the suite's shared cache and `env` added to this process's environment; `tag`: the
    processes it starts carry a tag, and any left 15 s after it ends are reported; `pool`: the
    address of the suite's shared ranks (tests/shared_pool.py) to run the tests in."""

    environ = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    environ.update(env or {})
    if pool is not None:
        environ.update(_shared_pool_environ(pool, environ))
        args = ("-p", "shared_pool", *args)
    value = uuid.uuid4().hex if tag else None
    if value is not None:
        environ[TAG_VARIABLE] = value
    command = [sys.executable, "-m", "pytest", *shared_cache(), *args]
    start = time.monotonic()
    done = subprocess.run(
        command, cwd=path, env=environ, capture_output=True, text=True, timeout=timeout
    )
    result = pytest.RunResult(
        done.returncode, done.stdout.splitlines(), done.stderr.splitlines(),
        time.monotonic() - start,
    )  # fmt: skip
    left = tuple(wait_until_gone(value)) if value is not None else ()
    return Session(path, result, left)


def use_shared_pool(monkeypatch: pytest.MonkeyPatch, address: str) -> tuple[str, ...]:
    """Arguments (and environment) that run a pytester subprocess session's tests in the suite's
    shared ranks (tests/shared_pool.py)."""
    for name, value in _shared_pool_environ(address, os.environ).items():
        monkeypatch.setenv(name, value)
    return ("-p", "shared_pool")


def _shared_pool_environ(address: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The host's address, and this directory on PYTHONPATH for `-p shared_pool`."""
    path = os.pathsep.join(p for p in (str(TESTS), environ.get("PYTHONPATH", "")) if p)
    return {SHARED_POOL_VARIABLE: address, "PYTHONPATH": path}


def write_files(path: Path, **files: str) -> None:
    """name=source: `name`.py in `path`, its source dedented."""
    for name, source in files.items():
        (path / f"{name}.py").write_text(textwrap.dedent(source))


# --------------------------------------------------------------------------- test modules

# Model builders for `distperf(model="builders:<name>")`: pytester.makepyfile(builders=BUILDERS)
BUILDERS = """
import os
import signal
import time
from pathlib import Path

from distperf_model.config import Config
from distperf_model.model import build_model


def _tiny(seed, device, dtype):
    return build_model(Config.from_name("tiny"), seed, device, dtype)


def recording(seed, device, dtype):
    # Leaves one file per (rank, pid): which processes ran the tests, and what they were given.
    Path("pids").mkdir(exist_ok=True)
    Path(f"pids/{os.environ['RANK']}-{os.getpid()}").write_text(os.environ.get("SET_LATE", ""))
    return _tiny(seed, device, dtype)


def raising(seed, device, dtype):
    if os.environ["RANK"] == "1":
        raise ValueError("boom on rank 1")
    return _tiny(seed, device, dtype)


def killed(seed, device, dtype):
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return _tiny(seed, device, dtype)


def hanging(seed, device, dtype):
    # rank 1 never arrives, so rank 0 waits in the first collective
    if os.environ["RANK"] == "1":
        time.sleep(3600)
    return _tiny(seed, device, dtype)


def chatty(seed, device, dtype):
    print(f"model built on rank {os.environ['RANK']}", flush=True)
    return _tiny(seed, device, dtype)


def running(seed, device, dtype):
    # Rank 0 says the ranks run, beside this module: a test may interrupt its session then.
    if os.environ["RANK"] == "0":
        Path(__file__).with_name("ranks-running").write_text(str(os.getpid()))
    return _tiny(seed, device, dtype)
"""


# --------------------------------------------------------------------------- a faked launcher

# In a pytest session's conftest.py: the session's runs come from fake_result, no rank starts.
FAKE_LAUNCH_CONFTEST = f"""
import sys

import pytest

sys.path.insert(0, {str(TESTS)!r})
import helpers


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    plugin = config.pluginmanager.get_plugin("distperf-session")
    plugin.launch = lambda spec, progress=None: helpers.fake_result(spec)
"""


def fake_result(spec: Any, total_s: float = 0.01) -> Any:
    """A RunResult for `spec` as healthy ranks would return it: each repeat takes `total_s`,
    as the bare model beside it and the reference step say; FAKE_SLOWDOWN=<factor> in the
    environment makes the repeats alone that much slower."""
    from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample

    steps = max(spec.workload.max_new_tokens - 1, 1)
    reference_token_s = total_s / (steps + 1)
    total_s *= float(os.environ.get("FAKE_SLOWDOWN", "1"))
    sample = Sample(total_s, total_s / (steps + 1), total_s * steps / (steps + 1))
    ranks = tuple(
        RankResult(
            rank=rank,
            samples=(sample,) * spec.repeats,
            peak_memory_bytes=1 << 20,
            memory_kind="process RSS peak",
            implementation=Implementation("SingleDeviceStrategy", "replicated", "gloo", ""),
            versions={"torch": "fake"},
            device_name="cpu",
            tokens=((1,) * spec.workload.max_new_tokens,) * spec.workload.batch_size,
            replicas=spec.devices,
            timed_from=time.time(),
            reference_token_s=reference_token_s,
            bare_samples=(Sample(reference_token_s * (steps + 1), None, None),) * spec.repeats,
            host_loop_s=(0.001,) * spec.repeats,
        )
        for rank in range(spec.devices)
    )
    return RunResult(spec=spec, ranks=ranks, launch_s=0.1, launched_at=time.time())
