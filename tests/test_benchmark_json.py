"""--distperf-benchmark-json: pytest-benchmark's saved-JSON format, read back by its own code.

The CLI tests run the installed `pytest-benchmark`; set DISTPERF_PYTEST_BENCHMARK_CLIS to more
executables (os.pathsep-separated, e.g. one from a venv with another release) to check those too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from pytest_distperf import gitinfo
from pytest_distperf.judge.checks import (
    Check,
    CheckStatus,
    Decision,
    DetectableFigures,
    skipped_check,
)
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.output import benchmark_json
from pytest_distperf.output.benchmark_json import (
    compute_stats,
    default_commit_info,
    to_benchmark_json,
    write_benchmark_json,
)
from pytest_distperf.spec import Implementation, RankResult, RunResult, RunSpec, Sample, Workload

MACHINE = {"node": "runner-1", "machine": "x86_64", "cpu": {"count": 2}}
COMMIT = {"id": "0" * 40, "time": None, "author_time": None, "dirty": False, "project": "p"}


def make_record(
    test_id: str,
    strategy: str = "ddp",
    devices: int = 2,
    totals: tuple[float, ...] = (0.50, 0.52, 0.49, 0.55, 0.51),
    workload: Workload | None = None,
    detectable_drop: float = 0.1,
) -> JudgedRun:
    """The record of a real `RunResult`; `totals` are the per-repeat generation times."""
    workload = workload or Workload(max_new_tokens=32, batch_size=2)
    spec = RunSpec(
        test_id=test_id,
        strategy=strategy,
        devices=devices,
        accelerator="cpu",
        workload=workload,
        repeats=len(totals),
        warmup=1,
        timeout=60.0,
    )
    implementation = Implementation("DDPStrategy", "replicated", "gloo", "DistributedDataParallel")
    ranks = tuple(
        _build(
            RankResult,
            rank=rank,
            # rank 1 is a little faster: the record must take the slowest rank per repeat
            samples=tuple(
                Sample(t * (1 - 0.1 * rank), 0.01, t * (1 - 0.1 * rank) - 0.01) for t in totals
            ),
            peak_memory_bytes=1000 + rank,
            memory_kind="process RSS peak",
            implementation=implementation,
            versions={"torch": "2.13.0"},
            device_name="cpu",
            tokens=((1, 2, 3),),
            replicas=devices,
        )
        for rank in range(devices)
    )
    result = _build(RunResult, spec=spec, ranks=ranks, launch_s=3.0)
    why = "not compared"
    decision = Decision(
        threshold=Check("threshold", CheckStatus.NOTE, "no prediction"),
        baseline=Check("baseline", CheckStatus.NOTE, "", DetectableFigures(detectable_drop)),
        relative_speed=skipped_check("relative_speed", why),
        memory=skipped_check("memory", why),
    )
    return JudgedRun.of(
        result,
        decision,
        prediction=None,
        topology_key=f"cpu_x{devices}_loopbackx1_2cpus",
        baseline_recorded=False,
        calibration=None,
        session_started_at=0.0,
    )


def _build(cls: type, **known: object) -> object:
    """`cls(**known)`, with zeros for bookkeeping fields added since (timestamps, counters)."""
    zeros = {"float": 0.0, "int": 0, "str": ""}
    for spec in dataclasses.fields(cls):
        required = (
            spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        )
        if required and spec.name not in known and str(spec.type) in zeros:
            known[spec.name] = zeros[str(spec.type)]
    return cls(**known)


RECORDS = [
    make_record("examples/test_generate.py::test_generate[ddp]", "ddp"),
    make_record("examples/test_generate.py::test_generate[fsdp]", "fsdp", totals=(1.0, 1.1, 0.9)),
    make_record("examples/test_other.py::TestSuite::test_single", "auto", 1, totals=(0.2,)),
]


# --- the conversion ------------------------------------------------------------------------------


def test_a_round_is_one_generation_in_seconds() -> None:
    document = to_benchmark_json(RECORDS, machine_info=MACHINE, commit_info=COMMIT)
    assert set(document) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert document["machine_info"] == MACHINE and document["commit_info"] == COMMIT
    assert document["version"] == version("pytest-benchmark")
    bench = document["benchmarks"][0]
    assert set(bench) == {
        "group",
        "name",
        "fullname",
        "params",
        "param",
        "extra_info",
        "options",
        "stats",
    }
    assert bench["name"] == "test_generate[ddp]"
    assert bench["fullname"] == "examples/test_generate.py::test_generate[ddp]"
    assert bench["param"] == "ddp"
    assert bench["group"] == (
        "model=tiny batch_size=2 prompt_length=8 max_new_tokens=32 precision=fp32"
    )
    assert bench["params"]["strategy"] == "ddp" and bench["params"]["devices"] == 2
    stats = bench["stats"]
    # 64 new tokens per generation; tokens/sec samples -> seconds per generation, in run order
    assert stats["data"] == pytest.approx([0.50, 0.52, 0.49, 0.55, 0.51])
    assert stats["rounds"] == 5 and stats["iterations"] == 1
    assert stats["ops"] == pytest.approx(1 / stats["mean"])
    assert stats["median"] == pytest.approx(64 / RECORDS[0].run.tokens_per_sec)
    extra = bench["extra_info"]
    assert extra["tokens_per_sec"] == RECORDS[0].run.tokens_per_sec
    assert extra["tokens_per_sec_samples"] == list(RECORDS[0].run.tokens_per_sec_samples)
    assert extra["strategy"] == "ddp" and extra["devices"] == 2
    assert extra["topology_key"] == "cpu_x2_loopbackx1_2cpus"
    assert extra["implementation"]["wrapper"] == "DistributedDataParallel"
    assert extra["new_tokens_per_generation"] == 64
    assert "test_id" not in extra
    assert bench["options"]["min_rounds"] == 5 and bench["options"]["warmup_iterations"] == 1

    single = document["benchmarks"][2]
    assert single["name"] == "test_single" and single["param"] is None
    assert single["stats"]["stddev"] == 0 and single["stats"]["q1"] == single["stats"]["q3"]


def _with_samples(record: JudgedRun, samples: tuple[float, ...]) -> JudgedRun:
    return dataclasses.replace(
        record, run=dataclasses.replace(record.run, tokens_per_sec_samples=samples)
    )


def test_runs_sharing_a_test_id_keep_distinct_names_and_empty_runs_are_left_out() -> None:
    twice = [RECORDS[0], RECORDS[0], _with_samples(RECORDS[1], ())]
    document = to_benchmark_json(twice, machine_info=MACHINE, commit_info=COMMIT)
    fullnames = [bench["fullname"] for bench in document["benchmarks"]]
    assert fullnames == [RECORDS[0].run.test_id, RECORDS[0].run.test_id + " #2"]


@pytest.mark.parametrize("samples", [(10.0, 0.0), (10.0, float("nan"))])
def test_samples_that_are_not_rates_name_the_test(samples: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match=r"test_generate\[ddp\]: .*must be positive numbers"):
        to_benchmark_json(
            [_with_samples(RECORDS[0], samples)], machine_info=MACHINE, commit_info=COMMIT
        )


DATASETS = [
    [1.0],
    [2.0, 1.0],
    [3.0, 1.0, 2.0],
    [4.0, 1.0, 3.0, 2.0],
    [1.0, 2.0, 3.0, 4.0, 5.0],
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
    [0.5, 0.52, 0.49, 0.55, 0.51, 0.5, 0.53, 0.5, 2.0],  # one slow outlier above the fence
    [0.01, 0.5, 0.52, 0.49, 0.55, 0.51, 0.5, 0.53, 0.5, 0.54],  # one below it
    [0.1 * i for i in range(1, 12)],
]


@pytest.mark.parametrize("data", DATASETS, ids=lambda data: f"n{len(data)}")
def test_stats_agree_with_pytest_benchmark(data: list[float]) -> None:
    from pytest_benchmark.stats import Stats

    reference = Stats()
    for value in data:
        reference.update(value)
    ours = compute_stats(data)
    expected = reference.as_dict()
    # 5.2.x returns the first datum *above* Q3 + 1.5 IQR when there is one (fixed in 5.3): the
    # Tukey whisker its docstring describes is the highest datum at or below that fence.
    fence = expected["q3"] + 1.5 * expected["iqr"]
    expected["hd15iqr"] = max(v for v in data if v <= fence)
    for field, value in expected.items():
        if isinstance(value, float):
            assert ours[field] == pytest.approx(value, rel=1e-12, abs=1e-15), field
        else:
            assert ours[field] == value, field
    assert ours["data"] == data and ours["iterations"] == 1


def test_quartiles_by_hand() -> None:
    # Odd n (Wikipedia method 3): n = 5 = 4*1 + 1 -> Q1 = 0.25 x1 + 0.75 x2 (1-based)
    five = compute_stats([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (five["q1"], five["median"], five["q3"]) == (1.75, 3.0, 4.25)
    # n = 7 = 4*1 + 3 -> Q1 = 0.75 x2 + 0.25 x3
    seven = compute_stats([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    assert (seven["q1"], seven["q3"]) == (2.25, 5.75)
    # Even n: medians of the halves
    six = compute_stats([1.0, 2.0, 3.0, 4.0, 5.0, 60.0])
    assert (six["q1"], six["q3"], six["iqr"]) == (2.0, 5.0, 3.0)
    assert (six["ld15iqr"], six["hd15iqr"], six["iqr_outliers"]) == (1.0, 5.0, 1)
    assert six["outliers"] == f"{six['stddev_outliers']};1"
    with pytest.raises(ValueError):
        compute_stats([])


# --- writing -------------------------------------------------------------------------------------


def test_write_is_atomic_and_strict_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out" / "benchmark.json"
    records = [make_record("t.py::test_a", detectable_drop=math.inf)]
    assert write_benchmark_json(target, records, MACHINE, COMMIT) == target
    text = target.read_text()
    document = json.loads(text, parse_constant=pytest.fail)  # no NaN / Infinity literals
    assert document["benchmarks"][0]["extra_info"]["detectable_drop"] == "inf"
    assert os.listdir(target.parent) == ["benchmark.json"]

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(benchmark_json.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_benchmark_json(target, RECORDS, MACHINE, COMMIT)
    assert target.read_text() == text  # the old file survives, no temp file is left behind
    assert os.listdir(target.parent) == ["benchmark.json"]


def test_default_machine_info_is_cheap_and_names_the_accelerators() -> None:
    info = benchmark_json.default_machine_info(RECORDS)
    assert info["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["cpu"]["count"] == os.cpu_count()
    assert info["distperf"]["topology_keys"] == [
        "cpu_x1_loopbackx1_2cpus",
        "cpu_x2_loopbackx1_2cpus",
    ]


# --- commit info ---------------------------------------------------------------------------------

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ)
    for role in ("AUTHOR", "COMMITTER"):
        env[f"GIT_{role}_NAME"], env[f"GIT_{role}_EMAIL"] = "t", "t@example.com"
    done = subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    return done.stdout.decode().strip()


@needs_git
def test_commit_info_from_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "myproject"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "trunk")
    (repo / "a.txt").write_text("1")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "untracked.json").write_text("{}")  # a report left behind is not a change
    info = default_commit_info(repo)
    assert info["id"] == _git(repo, "rev-parse", "HEAD")
    assert info["dirty"] is False and info["branch"] == "trunk"
    assert info["project"] == "myproject" and info["time"] and "error" not in info
    (repo / "a.txt").write_text("2")
    assert default_commit_info(repo)["dirty"] is True

    # CI checkouts are detached: the branch comes from the CI system
    _git(repo, "checkout", "-q", "--detach")
    monkeypatch.setenv("GITHUB_HEAD_REF", "feature-x")
    assert default_commit_info(repo)["branch"] == "feature-x"


@needs_git
def test_commit_info_without_a_repository_or_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert default_commit_info(tmp_path) == {
        "id": "unversioned", "time": None, "author_time": None, "dirty": False,
        "project": tmp_path.name, "branch": "(unknown)",
    }  # fmt: skip
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert default_commit_info(tmp_path)["id"] == "unversioned"


def test_commit_info_survives_a_hung_git(monkeypatch: pytest.MonkeyPatch) -> None:
    def hung(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="git", timeout=5)

    monkeypatch.setattr(gitinfo.subprocess, "run", hung)
    info = default_commit_info()
    assert info["id"] == "unversioned" and "TimeoutExpired" in info["error"]


# --- read back by pytest-benchmark ---------------------------------------------------------------


class _RecordingLogger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, text: str, **kwargs: object) -> None:
        self.warnings.append(text)

    def info(self, text: str, **kwargs: object) -> None:
        pass


def test_pytest_benchmark_storage_loads_the_file(tmp_path: Path) -> None:
    from pytest_benchmark.storage.file import FileStorage

    path = write_benchmark_json(tmp_path / "0001_distperf.json", RECORDS)
    logger = _RecordingLogger()
    loaded = list(FileStorage(tmp_path, logger=logger).load_benchmarks(str(path)))
    assert logger.warnings == []
    assert [bench["fullname"] for bench in loaded] == [r.run.test_id for r in RECORDS]
    for bench, record in zip(loaded, RECORDS, strict=True):
        assert bench["ops"] == pytest.approx(1 / bench["mean"])
        assert bench["extra_info"]["tokens_per_sec"] == record.run.tokens_per_sec
        median_rate = statistics.median(record.run.tokens_per_sec_samples)
        assert 64 / bench["median"] == pytest.approx(median_rate)


def _clis() -> list[list[str]]:
    installed = Path(sys.executable).with_name("pytest-benchmark")
    clis = [[str(installed)] if installed.exists() else [sys.executable, "-m", "pytest_benchmark"]]
    extra = os.environ.get("DISTPERF_PYTEST_BENCHMARK_CLIS", "")
    clis += [[path] for path in extra.split(os.pathsep) if path]
    return clis


def _run(cli: list[str], *args: str, cwd: Path) -> str:
    # In an empty directory: the CLI imports ./conftest.py and creates ./.benchmarks.
    done = subprocess.run(
        [*cli, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Failed to load" not in output
    return output


@pytest.fixture(params=_clis(), ids=lambda cli: cli[-1])
def cli(request: pytest.FixtureRequest) -> list[str]:
    return request.param


def test_pytest_benchmark_compare_reads_the_file(cli: list[str], tmp_path: Path) -> None:
    path = write_benchmark_json(tmp_path / "reports" / "benchmark.json", RECORDS)
    output = _run(cli, "compare", str(path), "--columns=min,max,mean,median", cwd=tmp_path)
    for name in ("test_generate[ddp]", "test_generate[fsdp]", "test_single"):
        assert name in output
    assert "model=tiny batch_size=2" in output  # the group header
    assert "Name (time in ms)" in output  # rounds are read as times: 0.2 s .. 1.1 s


def test_pytest_benchmark_compare_two_runs(cli: list[str], tmp_path: Path) -> None:
    baseline = write_benchmark_json(tmp_path / "0001_baseline.json", RECORDS)
    slower = [make_record(RECORDS[0].run.test_id, totals=(0.65, 0.66, 0.70, 0.64, 0.66))]
    slower += RECORDS[1:]
    current = write_benchmark_json(tmp_path / "0002_current.json", slower)
    output = _run(
        cli,
        "compare",
        str(baseline),
        str(current),
        "--group-by=name",
        "--columns=min,max,mean,median",
        cwd=tmp_path,
    )
    for name in ("test_generate[ddp]", "test_generate[fsdp]", "test_single"):
        assert f"benchmark '{name}': 2 tests" in output
    # each line names its source file (cut to 12 characters); the slower run takes 1.29x the time
    lines = [line for line in output.splitlines() if line.startswith("test_generate[ddp] (")]
    assert len(lines) == 2 and "0001_baselin)" in lines[0] and "0002_current)" in lines[1]
    assert "(1.29)" in lines[1]

    help_text = _run(cli, "compare", "--help", cwd=tmp_path)
    if "--between" in help_text:  # 5.3+: same fullname side by side across files
        output = _run(
            cli, "compare", str(baseline), str(current), "--between=mean,median", cwd=tmp_path
        )
        assert "test_generate[ddp]" in output and "ERROR" not in output
