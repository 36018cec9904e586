"""The rank pool on CPU ranks (gloo): reuse, isolation, faults, per-test rank counts."""

from __future__ import annotations

import json
import signal
import textwrap
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BUILDERS = """
import os
import signal
from pathlib import Path

from distperf_model.config import Config
from distperf_model.model import build_model


def _tiny(seed, device, dtype):
    return build_model(Config.from_name("tiny"), seed, device, dtype)


def recording(seed, device, dtype):
    # Leaves one file per (rank, pid): which processes ran the tests, and what they were given.
    Path(f"pids/{os.environ['RANK']}-{os.getpid()}").write_text(os.environ.get("SET_LATE", ""))
    return _tiny(seed, device, dtype)


def killed(seed, device, dtype):
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return _tiny(seed, device, dtype)


def raising(seed, device, dtype):
    if os.environ["RANK"] == "1":
        raise ValueError("boom on rank 1")
    return _tiny(seed, device, dtype)


def chatty(seed, device, dtype):
    print(f"model built on rank {os.environ['RANK']}", flush=True)
    return _tiny(seed, device, dtype)
"""


@pytest.fixture
def tag(monkeypatch: pytest.MonkeyPatch) -> str:
    from test_runs import _wait_until_gone

    value = uuid.uuid4().hex
    monkeypatch.setenv("DISTPERF_TEST_TAG", value)
    yield value
    assert _wait_until_gone(value) == []


def _pids(path: Path) -> dict[str, set[str]]:
    by_rank: dict[str, set[str]] = {}
    for entry in (path / "pids").iterdir():
        rank, pid = entry.name.split("-")
        by_rank.setdefault(rank, set()).add(pid)
    return by_rank


SUITE = """
import pytest

@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="builders:recording", max_new_tokens=3, efficiency=0.05)
@pytest.mark.parametrize("n", range(2))
def test_x(distperf, n):
    distperf.run()
"""


# Set once collection is over, after the session has started its first pool: that pool's ranks
# never saw it, so the first test must run in ranks started after it.
SET_LATE_CONFTEST = """
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def set_late():
    os.environ["SET_LATE"] = "seen"
"""


def test_ranks_are_started_once_and_reused(pytester: pytest.Pytester, tag: str) -> None:
    pytester.makepyfile(builders=BUILDERS, test_suite=SUITE)
    pytester.makeconftest(SET_LATE_CONFTEST)
    (pytester.path / "pids").mkdir()
    result = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-repeats=1")
    result.assert_outcomes(passed=4)
    assert {rank: len(pids) for rank, pids in _pids(pytester.path).items()} == {"0": 1, "1": 1}
    assert {path.read_text() for path in (pytester.path / "pids").iterdir()} == {"seen"}


def test_fresh_ranks_start_new_processes_per_test(pytester: pytest.Pytester, tag: str) -> None:
    pytester.makepyfile(builders=BUILDERS, test_suite=SUITE)
    (pytester.path / "pids").mkdir()
    result = pytester.runpytest_subprocess(
        "--distperf-devices=2", "--distperf-repeats=1", "--distperf-fresh-ranks", "-k", "auto"
    )
    result.assert_outcomes(passed=2)
    assert {rank: len(pids) for rank, pids in _pids(pytester.path).items()} == {"0": 2, "1": 2}


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


def test_a_rank_killed_by_a_signal_is_named_and_the_next_test_runs(
    pytester: pytest.Pytester, tag: str
) -> None:
    pytester.makepyfile(builders=BUILDERS)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="builders:killed")
        def test_a_killed(distperf):
            distperf.run()

        @pytest.mark.distperf(model="tiny", max_new_tokens=2, efficiency=0.05)
        def test_b_runs(distperf):
            assert distperf.run().tokens_per_sec > 0
        """
    )
    result = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-repeats=1")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*distperf: rank 1 of 2 failed after * s*",
            "*--- rank 1 (killed by SIGKILL (the kernel's OOM killer sends SIGKILL)*",
        ]
    )
    assert signal.SIGKILL  # the name above comes from signal.Signals


def test_a_raising_rank_fails_only_its_test(pytester: pytest.Pytester, tag: str) -> None:
    pytester.makepyfile(builders=BUILDERS)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="tiny", max_new_tokens=2, efficiency=0.05)
        def test_a_runs(distperf):
            distperf.run()

        @pytest.mark.distperf(model="builders:raising")
        def test_b_raises(distperf):
            distperf.run()

        @pytest.mark.distperf(model="tiny", max_new_tokens=2, efficiency=0.05)
        def test_c_runs_in_a_new_pool(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-repeats=1")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*distperf: rank 1 of 2 failed after * s*test_b_raises*",
            "*ValueError: boom on rank 1*",
        ]
    )


def test_same_test_alone_and_after_ten_others_gives_same_tokens_and_memory(
    pytester: pytest.Pytester, tag: str
) -> None:
    target = """
    @pytest.mark.strategy("fsdp")
    @pytest.mark.distperf(model="pythia-14m", max_new_tokens=4, efficiency=0.05)
    def test_target(distperf, request):
        result = distperf.run()
        seen = {"tokens": result.tokens, "peak": result.peak_memory_bytes}
        (request.config.rootpath / "target.json").write_text(json.dumps(seen))
    """
    # One other with a larger peak than the target's (a pool's peak would show through it),
    # nine small ones under every kind of strategy that frees what it built.
    others = """
    @pytest.mark.distperf(model="pythia-70m", max_new_tokens=2, efficiency=0.05)
    def test_other_larger(distperf):
        distperf.run()

    @pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
    @pytest.mark.distperf(model="tiny", max_new_tokens=2, efficiency=0.05)
    @pytest.mark.parametrize("n", range(3))
    def test_other(distperf, n):
        distperf.run()
    """
    rows = {}
    for name, body in (("alone", target), ("after", others + target)):
        source = "import json\nimport pytest\n" + textwrap.dedent(body)
        pytester.makepyfile(**{f"test_{name}": source})
        report = pytester.path / f"{name}.json"
        result = pytester.runpytest_subprocess(
            f"test_{name}.py", "--distperf-devices=2", "--distperf-repeats=2",
            f"--distperf-json={report}",
        )  # fmt: skip
        result.assert_outcomes(passed=1 if name == "alone" else 11)
        assert json.loads(report.read_text())["results"][-1]["test_id"].endswith("fsdp-2cpu]")
        rows[name] = json.loads((pytester.path / "target.json").read_text())
    alone, after = rows["alone"], rows["after"]
    assert after["tokens"] == alone["tokens"]
    # The test's own peak, not the pool's: within RSS noise of the same test alone.
    ratio = after["peak"] / alone["peak"]
    assert 0.85 < ratio < 1.15, (alone["peak"], after["peak"])


def test_devices_marker_runs_one_item_per_rank_count(pytester: pytest.Pytester, tag: str) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.devices(2, 1)
        @pytest.mark.strategy("auto", "fsdp")
        @pytest.mark.distperf(model="tiny", max_new_tokens=2, efficiency=0.05)
        def test_scaling(distperf):
            result = distperf.run()
            assert len(result.ranks) == distperf.devices
        """
    )
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-v", "--distperf-devices=2", "--distperf-repeats=1", f"--distperf-json={report}"
    )
    result.assert_outcomes(passed=4)
    # Grouped by rank count, so that each count's pool starts once.
    result.stdout.fnmatch_lines(
        [
            "*test_scaling[[]auto-1cpu[]] PASSED*",
            "*test_scaling[[]fsdp-1cpu[]] PASSED*",
            "*test_scaling[[]auto-2cpu[]] PASSED*",
            "*test_scaling[[]fsdp-2cpu[]] PASSED*",
        ]
    )
    rows = json.loads(report.read_text())["results"]
    assert [row["devices"] for row in rows] == [1, 1, 2, 2]


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


def test_rank_output_is_a_report_section_and_streams_with_s(
    pytester: pytest.Pytester, tag: str
) -> None:
    pytester.makepyfile(builders=BUILDERS)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="builders:chatty", max_new_tokens=2, efficiency=0.05)
        def test_x(distperf):
            distperf.run()
            assert False, "fails after the run"
        """
    )
    result = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-repeats=1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Captured rank 0 output call*",
            "model built on rank 0",
            "*Captured rank 1 output call*",
            "model built on rank 1",
        ]
    )
    streamed = pytester.runpytest_subprocess("-s", "--distperf-devices=2", "--distperf-repeats=1")
    # pytest -s prints the test file's name before its output, on the same line; the ranks
    # print at the same time, so either line may come first
    streamed.stdout.fnmatch_lines(["*model built on rank 0"])
    streamed.stdout.fnmatch_lines(["*[[]rank 1[]] model built on rank 1"])


def test_pool_ranks_inside_a_slurm_allocation_keep_their_own_ranks(
    pytester: pytest.Pytester, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An sbatch script that runs pytest itself (no srun, so no job mode): Fabric would take
    # every pool rank's rank from SLURM_PROCID unless the ranks say they are TorchElastic's.
    for name, value in (("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0"), ("SLURM_LOCALID", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_JOB_NAME", "gpu-ci")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.strategy("auto", "fsdp")
        @pytest.mark.distperf(model="tiny", max_new_tokens=2, efficiency=0.05)
        def test_x(distperf):
            result = distperf.run()
            assert sorted(rank.rank for rank in result.ranks) == [0, 1]
            assert result.ranks[0].replicas == 2
        """
    )
    result = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-repeats=1")
    result.assert_outcomes(passed=2)


def test_a_variable_ranks_read_at_start_keys_the_pool() -> None:
    from pytest_distperf.launch.pool import PoolKey

    plain = PoolKey.for_ranks("cuda", 2, {"HOME": "/root"})
    assert PoolKey.for_ranks("cuda", 2, {"HOME": "/tmp"}) == plain  # not one the ranks read
    for name in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "PYTORCH_CUDA_ALLOC_CONF"):
        key = PoolKey.for_ranks("cuda", 2, {"HOME": "/root", name: "0"})
        assert key != plain and key.comm_environment == ((name, "0"),), name


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


def test_a_tests_torch_settings_and_environment_end_with_it(
    pytester: pytest.Pytester, tag: str
) -> None:
    pytester.makepyfile(settings_builders=SETTINGS_BUILDERS)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="settings_builders:changing", max_new_tokens=2)
        def test_a_changes(distperf):
            distperf.run()

        @pytest.mark.distperf(model="settings_builders:recording", max_new_tokens=2)
        def test_b_records(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest_subprocess(
        "--distperf-devices=2", "--distperf-repeats=1", "--distperf-efficiency=0.05"
    )
    result.assert_outcomes(passed=2)
    for rank in (0, 1):
        seen = json.loads((pytester.path / f"seen-{rank}").read_text())
        assert seen == ["highest", "torch.float32", False], rank


# Spawned ranks (and only they) stall at interpreter start, before they could ever be ready.
STALLING_SITECUSTOMIZE = """
import sys
import time

if "--multiprocessing-fork" in sys.argv:
    time.sleep(60)
"""


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
