"""The rank pool on CPU ranks (gloo): reuse, isolation, output, per-test rank counts.

The end-to-end sessions run once per module (fixtures below) and many tests read what they
left: the outcome, the output, files the tests wrote from their ranks, the JSON report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import BUILDERS, Session, run_session, write_files

# --- one session, one pool: reuse, a test's settings, SLURM's variables, the ranks' output ---

# Set once collection is over, after the session has started its first pool: that pool's ranks
# never saw it, so the first test must run in ranks started after it.
SET_LATE_CONFTEST = """
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def set_late():
    os.environ["SET_LATE"] = "seen"
"""

REUSED = """
import pytest

@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="builders:recording", max_new_tokens=3, gates=False)
@pytest.mark.parametrize("n", range(2))
def test_x(distperf, n):
    distperf.run()
"""

SETTINGS_BUILDERS = """
import json
import os
from pathlib import Path

import torch
from distperf_model.config import Config
from distperf_model.model import build_model


def changing(seed, device, dtype):
    model = build_model(Config.from_name("tiny"), seed, device, dtype)
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    os.environ["SET_BY_A_TEST"] = "1"
    return model


def recording(seed, device, dtype):
    seen = [torch.get_float32_matmul_precision(), str(torch.get_default_dtype())]
    seen.append("SET_BY_A_TEST" in os.environ)
    Path(f"seen-{os.environ['RANK']}").write_text(json.dumps(seen))
    return build_model(Config.from_name("tiny"), seed, device, dtype)
"""

SETTINGS = """
import pytest

@pytest.mark.distperf(model="settings_builders:changing", max_new_tokens=2, gates=False)
def test_a_changes(distperf):
    distperf.run()

@pytest.mark.distperf(model="settings_builders:recording", max_new_tokens=2, gates=False)
def test_b_records(distperf):
    distperf.run()
"""

SLURM = """
import pytest

@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
def test_x(distperf):
    result = distperf.run()
    assert sorted(rank.rank for rank in result.ranks) == [0, 1]
    assert result.ranks[0].replicas == 2
"""

CHATTY = """
import pytest

@pytest.mark.distperf(model="builders:chatty", max_new_tokens=2, gates=False)
def test_x(distperf):
    distperf.run()
    assert False, "fails after the run"
"""

# An sbatch script that runs pytest itself (no srun, so no job mode): Fabric would take every
# pool rank's rank from SLURM_PROCID unless the ranks say they are TorchElastic's.
SLURM_ALLOCATION = {
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NAME": "gpu-ci",
}


@pytest.fixture(scope="module")
def reused(tmp_path_factory: pytest.TempPathFactory) -> Session:
    path = tmp_path_factory.mktemp("reused")
    write_files(
        path,
        builders=BUILDERS,
        settings_builders=SETTINGS_BUILDERS,
        conftest=SET_LATE_CONFTEST,
        test_chatty=CHATTY,
        test_settings=SETTINGS,
        test_slurm=SLURM,
        test_suite=REUSED,
    )
    # -s: the ranks' output streams as they run, and is still a failed test's report section
    args = ("-v", "-s", "--distperf-devices=2", "--distperf-repeats=1")
    return run_session(path, *args, env=SLURM_ALLOCATION)


def _pids(path: Path) -> dict[str, set[str]]:
    by_rank: dict[str, set[str]] = {}
    for entry in (path / "pids").iterdir():
        rank, pid = entry.name.split("-")
        by_rank.setdefault(rank, set()).add(pid)
    return by_rank


@pytest.mark.slow
def test_ranks_are_started_once_and_reused(reused: Session) -> None:
    reused.assert_outcomes(passed=8, failed=1)  # test_chatty fails after its run
    assert {rank: len(pids) for rank, pids in _pids(reused.path).items()} == {"0": 1, "1": 1}
    # The pool started ahead of the first test never ran one: its ranks lacked SET_LATE.
    assert {path.read_text() for path in (reused.path / "pids").iterdir()} == {"seen"}
    assert reused.left_behind == ()


@pytest.mark.slow
def test_a_tests_torch_settings_and_environment_end_with_it(reused: Session) -> None:
    reused.result.stdout.fnmatch_lines(
        ["*test_settings.py::test_a_changes*PASSED*", "*test_settings.py::test_b_records*PASSED*"]
    )
    for rank in (0, 1):
        seen = json.loads((reused.path / f"seen-{rank}").read_text())
        assert seen == ["highest", "torch.float32", False], rank


@pytest.mark.slow
def test_pool_ranks_inside_a_slurm_allocation_keep_their_own_ranks(reused: Session) -> None:
    reused.result.stdout.fnmatch_lines(
        [f"*test_slurm.py::test_x[[]{name}-2cpu[]]*PASSED*" for name in ("auto", "fsdp")]
    )


@pytest.mark.slow
def test_rank_output_is_a_report_section_and_streams_with_s(reused: Session) -> None:
    reused.result.stdout.fnmatch_lines(
        [
            "*Captured rank 0 output call*",
            "model built on rank 0",
            "*Captured rank 1 output call*",
            "model built on rank 1",
        ]
    )
    # pytest -s prints the test file's name before its output, on the same line; the ranks
    # print at the same time, so either line may come first
    reused.result.stdout.fnmatch_lines(["*model built on rank 0"])
    reused.result.stdout.fnmatch_lines(["*[[]rank 1[]] model built on rank 1"])


@pytest.mark.slow
def test_a_session_that_runs_no_distperf_test_starts_no_ranks(
    pytester: pytest.Pytester, tag: str
) -> None:
    pytester.makepyfile(
        """
        import os
        from pathlib import Path

        import pytest

        @pytest.mark.distperf(model="tiny")
        def test_perf(distperf):
            distperf.run()

        def test_plain():
            # Runs after collection: ranks started for the deselected test would run by now.
            tagged = f"DISTPERF_TEST_TAG={os.environ['DISTPERF_TEST_TAG']}".encode()
            others = []
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and int(entry.name) != os.getpid():
                    try:
                        if tagged in (entry / "environ").read_bytes():
                            others.append(entry.name)
                    except OSError:
                        pass
            assert others == []
        """
    )
    for args in (["-k", "test_plain"], ["-m", "not distperf"]):
        result = pytester.runpytest_subprocess("--distperf-devices=2", *args)
        result.assert_outcomes(passed=1)


# --- the same test alone and after others; rank counts from the devices marker ---------------

TARGET = """
@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="builders:recording", max_new_tokens=4, gates=False)
def test_target(distperf, request):
    result = distperf.run()
    seen = {"tokens": result.tokens, "peak": result.peak_memory_bytes}
    (request.config.rootpath / "target.json").write_text(json.dumps(seen))
"""

# One other with a peak well above the target's (a pool's peak would show through it), nine
# small ones under every kind of strategy that frees what it built.
OTHERS = """
@pytest.mark.distperf(model="pythia-70m", max_new_tokens=2, gates=False)
def test_other_larger(distperf):
    distperf.run()

@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
@pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
@pytest.mark.parametrize("n", range(3))
def test_other(distperf, n):
    distperf.run()
"""

SCALING = """
import pytest

@pytest.mark.devices(2, 1)
@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=2, gates=False)
def test_scaling(distperf):
    result = distperf.run()
    assert len(result.ranks) == distperf.devices
"""

HEAD = "import json\nimport pytest\n"


@pytest.fixture(scope="module")
def alone_and_after(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Session]:
    """The target test alone, in ranks of its own (--distperf-fresh-ranks, after a test that
    gets its own; both leave their ranks' pids); then after ten others (and the devices
    marker's test, whose file comes first), in one pool."""
    args = ("-v", "--distperf-devices=2", "--distperf-repeats=1", "--distperf-json=report.json")
    fresh = ("--distperf-fresh-ranks", "-k", "auto-2cpu-0 or test_target")
    alone = {"builders": BUILDERS, "test_suite": REUSED, "test_target": HEAD + TARGET}
    sessions = {}
    for name, files, extra in (
        ("alone", alone, fresh),
        (
            "after",
            {
                "builders": BUILDERS,
                "test_a_scaling": SCALING,
                "test_target": HEAD + OTHERS + TARGET,
            },
            (),
        ),
    ):
        path = tmp_path_factory.mktemp(name)
        write_files(path, **files)
        sessions[name] = run_session(path, *args, *extra)
    return sessions


def _target_seen(alone_and_after: dict[str, Session]) -> dict[str, dict]:
    """What the target test wrote in each session: its tokens and its peak memory."""
    seen = {}
    for name, session in alone_and_after.items():
        last = json.loads((session.path / "report.json").read_text())["results"][-1]
        assert last["test_id"] == "test_target.py::test_target[fsdp-2cpu]"
        seen[name] = json.loads((session.path / "target.json").read_text())
        assert session.left_behind == ()
    return seen


@pytest.mark.slow
def test_same_test_alone_and_after_ten_others_gives_same_tokens(
    alone_and_after: dict[str, Session],
) -> None:
    alone_and_after["alone"].assert_outcomes(passed=2, deselected=3)
    alone_and_after["after"].assert_outcomes(passed=15)
    seen = _target_seen(alone_and_after)
    assert seen["after"]["tokens"] == seen["alone"]["tokens"]


@pytest.mark.slow
def test_same_test_alone_and_after_ten_others_gives_same_memory(
    alone_and_after: dict[str, Session],
) -> None:
    # The test's own peak, not the pool's: within RSS noise of the same test alone, far under
    # the larger test's, which the pool's peak would be. A tiny target, whose peak is steady (a
    # pythia-14m one's moved 17% between sessions), and the first of its builder here: a
    # builder's calibration in its first test once doubled its peak (ranks/phases.py).
    seen = _target_seen(alone_and_after)
    alone, after = seen["alone"], seen["after"]
    larger = alone_and_after["after"].rows()["test_other_larger[auto-2cpu]"]["peak_memory_bytes"]
    assert larger > 1.6 * alone["peak"], (larger, alone["peak"])
    ratio = after["peak"] / alone["peak"]
    assert 0.85 < ratio < 1.15, (alone["peak"], after["peak"])


@pytest.mark.slow
def test_devices_marker_runs_one_item_per_rank_count(alone_and_after: dict[str, Session]) -> None:
    session = alone_and_after["after"]
    # Grouped by rank count, so that each count's pool starts once.
    session.result.stdout.fnmatch_lines(
        [
            "*test_scaling[[]auto-1cpu[]] PASSED*",
            "*test_scaling[[]fsdp-1cpu[]] PASSED*",
            "*test_scaling[[]auto-2cpu[]] PASSED*",
            "*test_scaling[[]fsdp-2cpu[]] PASSED*",
        ]
    )
    rows = session.rows()
    assert [rows[f"test_scaling[{s}]"]["devices"] for s in ("auto-1cpu", "auto-2cpu")] == [1, 2]
    assert [row["devices"] for row in rows.values()][:2] == [1, 1]


@pytest.mark.slow
def test_fresh_ranks_start_new_processes_per_test(alone_and_after: dict[str, Session]) -> None:
    session = alone_and_after["alone"]
    session.result.stdout.fnmatch_lines(
        ["*test_suite.py::test_x[[]auto-2cpu-0[]] PASSED*", "*test_target.py::test_target*PASSED*"]
    )
    assert {rank: len(pids) for rank, pids in _pids(session.path).items()} == {"0": 2, "1": 2}


# --- a pool that does not start -----------------------------------------------------------------

# Spawned ranks (and only they) stall at interpreter start, before they could ever be ready.
STALLING_SITECUSTOMIZE = """
import sys
import time

if "--multiprocessing-fork" in sys.argv:
    time.sleep(60)
"""


@pytest.mark.slow
def test_a_pool_that_does_not_start_says_so(
    pytester: pytest.Pytester, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = pytester.mkdir("site")
    (site / "sitecustomize.py").write_text(STALLING_SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    pytester.makeconftest(
        """
        from pytest_distperf.launch import pool

        pool.START_TIMEOUT_S = 3.0
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="tiny", max_new_tokens=2)
        def test_x(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest_subprocess("--distperf-devices=2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*distperf: the rank pool did not start within 3 s (process start, imports, process*"]
    )
    result.stdout.no_fnmatch_line("*rank 0 of 2 failed*")


# --- no ranks: markers and pool keys --------------------------------------------------------------


def test_bad_devices_marker_names_the_value(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.devices(0, "two")
        @pytest.mark.distperf(model="tiny")
        def test_x(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest("--distperf-devices=2")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*devices takes positive integers (rank counts), got 0, 'two'*"])


def test_more_cuda_devices_than_visible_skip_with_both_numbers(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.devices(4)
        @pytest.mark.distperf(model="tiny")
        def test_x(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest("-rs", "--distperf-accelerator=cuda")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*4 CUDA devices requested (@pytest.mark.devices) but * visible*"])


def test_a_variable_ranks_read_at_start_keys_the_pool() -> None:
    from pytest_distperf.launch.pool import PoolKey

    plain = PoolKey.for_ranks("cuda", 2, {"HOME": "/root"})
    assert PoolKey.for_ranks("cuda", 2, {"HOME": "/tmp"}) == plain  # not one the ranks read
    for name in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "PYTORCH_CUDA_ALLOC_CONF"):
        key = PoolKey.for_ranks("cuda", 2, {"HOME": "/root", name: "0"})
        assert key != plain and key.comm_environment == ((name, "0"),), name


@pytest.mark.parametrize("phase", ["calibrate", "calibrate_model"])
@pytest.mark.parametrize(("built", "after", "reported"), [(700, 400, 700), (300, 500, 500)])
def test_a_calibration_in_the_test_is_not_its_peak(
    monkeypatch: pytest.MonkeyPatch, phase: str, built: int, after: int, reported: int
) -> None:
    # The peak read after calibrating holds only what came after it; the one before stays
    # (the session's sizes in a fresh or job rank; a builder's own sizes once it is built).
    from types import SimpleNamespace

    from pytest_distperf.platform import CUDA
    from pytest_distperf.ranks import phases

    readings = iter([built, after])  # before calibrating (the build's), then the test's own
    resets: list[str] = []
    monkeypatch.setattr(phases.memory, "peak", lambda device: (next(readings), "RSS"))
    monkeypatch.setattr(phases.memory, "reset_peak", lambda device: resets.append("reset"))
    monkeypatch.setattr(phases, "calibrated", lambda ctx, own, dtype: resets.append("calibrated"))
    monkeypatch.setattr(phases, "message_sizes_for", lambda *args: None)
    ctx = SimpleNamespace(
        workload=SimpleNamespace(precision="fp32", batch_size=1),
        spec=SimpleNamespace(
            calibrate_model=phase == "calibrate_model", calibration_sizes=(), devices=2
        ),
        model=SimpleNamespace(shape=None),
        device="cuda",
        platform=CUDA,
        dtype=None,
        peak_floor=0,
        bare=SimpleNamespace(reported_peak=lambda peak, kind: (peak, kind)),
    )
    getattr(phases, phase)(ctx)
    assert resets == ["calibrated", "reset"] and ctx.peak_floor == built
    phases.memory_peak(ctx)
    assert ctx.peak_memory == (reported, "RSS")
