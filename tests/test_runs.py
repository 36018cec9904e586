"""Real rank processes on CPU (gloo): results, rank failures, hangs, Ctrl-C, jobs, leftovers.

One session (the `runs` fixture) runs the results' tests and the ranks' faults in one pool, as
a user's session would meet them: each fault fails its own test, stops the pool, and the next
test gets a new one; many tests below read what it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from helpers import BUILDERS, Session, processes_tagged, run_session, shared_cache, write_files

# The ranks do the torch work; the pytest process stays without torch (seconds of import).
NO_TORCH_CONFTEST = """
import sys
from pathlib import Path


def pytest_sessionfinish(session):
    Path("torch-imported").write_text(str("torch" in sys.modules))
"""

RESULTS = """
import pytest

# Results and reports, not a test of the gates: they are off.
@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=6, gates=False)
def test_throughput(distperf):
    result = distperf.run()
    assert result.tokens_per_sec > 0
    assert len(result.samples) == 3
    assert len(result.ranks) == 2
    assert result.implementation.backend == "gloo"
"""

# Each fault stops the pool; the test after it runs in a new one.
FAULTS = """
import pytest

@pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
def test_a_runs(distperf):
    distperf.run()

@pytest.mark.distperf(model="builders:raising")
def test_b_raises(distperf):
    distperf.run()

@pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
def test_c_runs_in_a_new_pool(distperf):
    assert distperf.run().tokens_per_sec > 0

@pytest.mark.distperf(model="builders:killed")
def test_d_killed(distperf):
    distperf.run()

@pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
def test_e_runs(distperf):
    assert distperf.run().tokens_per_sec > 0
"""

CACHE_BUILDERS = """
import dataclasses
import os
from pathlib import Path

from distperf_model.config import Config
from distperf_model.model import build_model


def recording_caches(seed, device, dtype):
    # Each rank's model writes the cache length of every setup_caches call (its whole copy too).
    model = build_model(Config.from_name("tiny"), seed, device, dtype)
    own = model.setup_caches

    def setup_caches(max_batch_size, max_seq_length, **kwargs):
        with Path(f"caches-{os.environ['RANK']}").open("a") as out:
            out.write(f"{max_seq_length}\\n")
        return own(max_batch_size, max_seq_length, **kwargs)

    model.setup_caches = setup_caches
    return model


def short_context(seed, device, dtype):
    config = dataclasses.replace(Config.from_name("tiny"), block_size=16)
    return build_model(config, seed, device, dtype)
"""

CACHES = """
import pytest

@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(
    model="cache_builders:recording_caches", max_new_tokens=12, prompt_length=5, gates=False
)
def test_rate(distperf):
    distperf.run()

# a builder's context limit is known only once built: the rank checks the whole run
@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="cache_builders:short_context", max_new_tokens=12, prompt_length=5)
def test_too_long(distperf):
    distperf.run()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Session:
    path = tmp_path_factory.mktemp("runs")
    write_files(
        path,
        conftest=NO_TORCH_CONFTEST,
        builders=BUILDERS,
        cache_builders=CACHE_BUILDERS,
        test_a_results=RESULTS,
        test_b_faults=FAULTS,
        test_c_caches=CACHES,
    )
    args = ("-v", "--distperf-devices=2", "--distperf-repeats=3", "--distperf-json=report.json")
    return run_session(path, *args)


@pytest.mark.slow
def test_the_session_ends_with_every_fault_in_its_own_test(runs: Session) -> None:
    runs.assert_outcomes(passed=6, failed=3)
    assert runs.left_behind == ()
    # the pytest process never imported torch, not even for the faults
    assert (runs.path / "torch-imported").read_text() == "False"


@pytest.mark.slow
def test_two_strategies_report_results(runs: Session) -> None:
    runs.result.stdout.fnmatch_lines(
        [
            "*distperf results*",
            "topology cpu_*",
            "*tok/s*decode*ttft*strategy*predicted*bound*baseline*change*verdict*test",
            "*auto*2 x cpu*off*test_throughput[[]auto-2cpu[]]",
            "*fsdp*2 x cpu*off*test_throughput[[]fsdp-2cpu[]]",
        ]
    )
    rows = runs.rows()
    auto, fsdp = rows["test_throughput[auto-2cpu]"], rows["test_throughput[fsdp-2cpu]"]
    assert (auto["strategy"], fsdp["strategy"]) == ("auto", "fsdp")
    assert fsdp["implementation"]["sharding"] == "FSDP2 reshard_after_forward=True"
    assert all(len(row["tokens_per_sec_samples"]) == 3 for row in (auto, fsdp))
    # The bare model ran beside every repeat of fsdp (a whole copy: it changes what runs), which
    # on two gloo ranks all-gathering every step runs well below it; auto's only on request.
    assert len(fsdp["relative_speed_samples"]) == 3 and 0 < fsdp["relative_speed"] < 1
    assert auto["relative_speed"] is None and not auto["relative_speed_samples"]
    assert auto["reference_source"] == "the bare model timed after the timed generations"
    assert fsdp["reference_source"] == "the bare model beside each timed generation"
    # And the host-speed loop beside every repeat: milliseconds, not zero, not a stray second.
    assert all(len(row["host_loop_samples"]) == 3 for row in (auto, fsdp))
    assert all(0.0005 < t < 1.0 for row in (auto, fsdp) for t in row["host_loop_samples"])
    assert fsdp["memory_kind"] == "process RSS peak (before the bare copy was built)"


@pytest.mark.slow
def test_failing_rank_shows_rank_and_traceback_and_only_its_test_fails(runs: Session) -> None:
    runs.result.stdout.fnmatch_lines(
        [
            "*distperf: rank 1 of 2 failed after * s [[]auto, 2 cpu ranks*test_b_raises*",
            "*--- rank 1 (exit code 1*",
            "*Traceback*",
            "*builders.py*in raising*",
            "*ValueError: boom on rank 1*",
        ]
    )
    runs.result.stdout.no_fnmatch_line("*--distperf-timeout*were stopped*")
    runs.result.stdout.fnmatch_lines(["*test_c_runs_in_a_new_pool*PASSED*"])


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_and_the_next_test_runs(runs: Session) -> None:
    runs.result.stdout.fnmatch_lines(
        [
            "*distperf: rank 1 of 2 failed after * s*",
            "*--- rank 1 (killed by SIGKILL (the kernel's OOM killer sends SIGKILL)*",
        ]
    )
    runs.result.stdout.fnmatch_lines(["*test_e_runs*PASSED*"])


@pytest.mark.slow
def test_a_sharded_runs_reference_reads_the_runs_cache_length(runs: Session) -> None:
    # Attention reads the whole static cache each step: a reference timed with a shorter cache
    # than the run's would predict too fast a step.
    runs.result.stdout.fnmatch_lines(
        [
            "*distperf(prompt_length=5, max_new_tokens=12) needs 17 positions but model "
            "'cache_builders:short_context' accepts 16*"
        ]
    )
    for rank in (0, 1):
        lengths = (runs.path / f"caches-{rank}").read_text().split()
        # the run, then the whole copy beside it, its reference (a builder's model is built
        # again, not copied: its construction is the contract)
        assert lengths == ["17", "17"], rank


@pytest.mark.slow
def test_hung_rank_is_stopped_with_stack_dump_and_next_test_runs(
    pytester: pytest.Pytester, tag: str
) -> None:
    pytester.makepyfile(builders=BUILDERS)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="builders:hanging")
        def test_a_hangs(distperf):
            distperf.run()

        @pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
        def test_b_runs(distperf):
            assert distperf.run().tokens_per_sec > 0
        """
    )
    # The timeout covers a test's work in its ranks (not their start): a few seconds more than
    # test_b_runs needs on a busy machine, and than rank 1 needs to reach its sleep.
    result = pytester.runpytest_subprocess(
        *shared_cache(), "--distperf-devices=2", "--distperf-timeout=4", "--distperf-repeats=1"
    )
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*ranks still running after --distperf-timeout=4 s were stopped*",
            "*--- rank 1*",
            "*builders.py*in hanging*",
        ]
    )
    # Each rank's own watchdog fires at the timeout; whichever fires first dumps under this
    # header and exits, and the launcher's SIGTERM makes the other dump its stack as it is.
    result.stdout.fnmatch_lines(["*Timeout (0:00:04)!*"])


LONG_TEST = """
import pytest

@pytest.mark.distperf(model="builders:running", max_new_tokens=200)
def test_long(distperf):
    distperf.run()

def test_after():
    pass
"""


# pytest with SIGINT at its default action, as a terminal's foreground job has it. A shell that
# starts a job in the background without job control leaves SIGINT ignored, every process
# under it inherits that, and Python then keeps it ignored: a Ctrl-C would do nothing at all.
AS_IN_A_TERMINAL = (
    "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.exit(pytest.console_main())"
)


def _interrupted_session(
    pytester: pytest.Pytester, interrupt: Callable[[subprocess.Popen[bytes]], None]
) -> tuple[int, str]:
    """Run LONG_TEST's session in a process group of its own, call `interrupt` on it once its
    ranks run, and return its exit status and output."""
    pytester.makepyfile(LONG_TEST, builders=BUILDERS)
    marker = pytester.path / "ranks-running"  # the builder's, once the ranks run
    command = [sys.executable, "-c", AS_IN_A_TERMINAL, "-p", "no:cacheprovider", "-v"]
    command += ["--distperf-devices=2", "--distperf-repeats=1000"]
    process = subprocess.Popen(
        command,
        cwd=pytester.path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), process.communicate(timeout=30)[0].decode()
        interrupt(process)
        output = process.communicate(timeout=60)[0].decode()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, output


@pytest.mark.slow
def test_ctrl_c_leaves_no_process_behind(pytester: pytest.Pytester, tag: str) -> None:
    def ctrl_c(process: subprocess.Popen[bytes]) -> None:
        assert len(processes_tagged(tag)) >= 3  # pytest and two ranks
        # To the whole group, as a terminal's Ctrl-C reaches the foreground process group.
        os.killpg(process.pid, signal.SIGINT)

    returncode, output = _interrupted_session(pytester, ctrl_c)
    assert returncode == pytest.ExitCode.INTERRUPTED, output
    assert "KeyboardInterrupt" in output
    assert "test_after PASSED" not in output


@pytest.mark.slow
def test_sigterm_stops_the_session_not_just_the_test(pytester: pytest.Pytester, tag: str) -> None:
    # A CI runner cancelling a job sends SIGTERM to pytest alone: the ranks must go, and so must
    # the session, instead of failing this test and starting the next one.
    returncode, output = _interrupted_session(pytester, lambda p: p.send_signal(signal.SIGTERM))
    assert returncode == 128 + signal.SIGTERM, output
    assert "distperf: SIGTERM received while running" in output
    assert "test_after" not in output


TORCHRUN = ("-m", "torch.distributed.run", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0")


@pytest.mark.slow
def test_a_torchrun_job_of_one_rank_runs_without_a_process_group(
    pytester: pytest.Pytester, tag: str
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="tiny", max_new_tokens=4, gates=False)
        def test_alone(distperf):
            assert [r.rank for r in distperf.run().ranks] == [0]
        """
    )
    command = [
        *(sys.executable, *TORCHRUN, "--nproc-per-node=1", "--max-restarts=0"),
        f"--log-dir={pytester.path / 'torchrun-logs'}",  # not a new directory in /tmp
        *("-m", "pytest", "-p", "no:cacheprovider"),
    ]
    done = subprocess.run(command, cwd=pytester.path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "test_alone[auto-1cpu]" in done.stdout
