"""distperf runs as benchmarks of pytest-benchmark's session (output/benchmark_session.py).

The fast tests feed rounds made up here through the bridge into a real pytest-benchmark
session; the slow ones run real ranks: autosave, then `--benchmark-compare-fail` catching
attention slowed by a few milliseconds per call, and distperf without pytest-benchmark.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import shared_cache, use_shared_pool

from pytest_distperf.judge.checks import (
    Check,
    CheckStatus,
    Decision,
    DetectableFigures,
    ThresholdFigures,
    skipped_check,
)
from pytest_distperf.judge.record import JudgedRun
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.output.benchmark_session import (
    MACHINE_INFO_KEY,
    extra_info,
    update_machine_info,
    without_distperf_machine_info,
)
from pytest_distperf.spec import RunSpec, Workload

TESTS = Path(__file__).resolve().parent


def make_run(
    test_id: str, totals: tuple[float, ...] = (0.50, 0.52, 0.49, 0.55, 0.51)
) -> tuple[RunResult, JudgedRun]:
    """A RunResult of 2 CPU ranks whose slowest rank took `totals` seconds per generation,
    judged with a prediction (bound "compute") and no baseline."""
    spec = RunSpec(test_id, "auto", 2, "cpu", Workload(max_new_tokens=32), len(totals), 1, 60.0)
    implementation = Implementation("DDPStrategy", "replicated", "gloo", "DistributedDataParallel")
    ranks = tuple(
        _build(
            RankResult,
            rank=rank,
            # rank 1 is a little faster: the rounds must be the slowest rank's
            samples=tuple(Sample(t * (1 - 0.1 * rank), 0.01, t - 0.01) for t in totals),
            peak_memory_bytes=1000,
            memory_kind="process RSS peak",
            implementation=implementation,
            versions={"torch": "2.13.0"},
            device_name="cpu",
            tokens=((1, 2, 3),),
            replicas=2,
        )
        for rank in range(2)
    )
    result = _build(RunResult, spec=spec, ranks=ranks, launch_s=3.0)
    figures = ThresholdFigures(80.0, 56.0, 0.7, "compute", "single-rank compute", "LOOPBACK", 0.8)
    decision = Decision(
        threshold=Check("threshold", CheckStatus.OK, "fine", figures),
        baseline=Check("baseline", CheckStatus.NOTE, "", DetectableFigures(math.inf)),
        relative_speed=skipped_check("relative_speed", "not compared"),
        memory=skipped_check("memory", "not compared"),
    )
    record = JudgedRun.of(
        result,
        decision,
        prediction=None,
        topology_key="cpu_x2_loopbackx1_2cpus",
        baseline_recorded=False,
        calibration=None,
        session_started_at=0.0,
    )
    return result, record


def _build(cls: type, **known: object) -> object:
    """`cls(**known)`, with zeros for bookkeeping fields added since (timestamps, counters)."""
    zeros = {"float": 0.0, "int": 0, "str": ""}
    for spec in dataclasses.fields(cls):
        required = spec.init and (
            spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        )
        if required and spec.name not in known and str(spec.type) in zeros:
            known[spec.name] = zeros[str(spec.type)]
    return cls(**known)


def test_extra_info_carries_what_distperf_gates_on() -> None:
    _, record = make_run("t.py::test_a[auto-2cpu]")
    extra = extra_info(record)
    assert extra["tokens_per_sec"] == pytest.approx(32 / 0.51)
    assert (extra["strategy"], extra["devices"], extra["accelerator"]) == ("auto", 2, "cpu")
    assert extra["topology_key"] == "cpu_x2_loopbackx1_2cpus"
    assert (extra["predicted_tokens_per_sec"], extra["bound"]) == (80.0, "compute")
    assert extra["threshold_tokens_per_sec"] == 56.0
    assert extra["detectable_drop"] == "inf"  # strict JSON has no Infinity
    assert extra["new_tokens_per_generation"] == 32
    json.dumps(extra, allow_nan=False)


def test_machine_info_names_topology_keys_and_devices() -> None:
    info: dict = {"node": "n"}
    update_machine_info(info, [])
    assert info == {"node": "n"}  # no distperf run: nothing added
    update_machine_info(info, [make_run("t.py::test_a")[1], make_run("t.py::test_b")[1]])
    assert info[MACHINE_INFO_KEY] == {
        "topology_keys": ["cpu_x2_loopbackx1_2cpus"],
        "device_names": ["cpu"],
    }
    saved = {"machine_info": {"node": "n", MACHINE_INFO_KEY: {}}}
    assert without_distperf_machine_info(saved) == {"node": "n"}
    assert without_distperf_machine_info({"machine_info": {"node": "n"}}) is None


# --- a real pytest-benchmark session, rounds made up here ----------------------------------

BRIDGE_CONFTEST = f"""
import os, sys
import pytest

sys.path.insert(0, {str(TESTS)!r})
from test_benchmark_session import make_run

from pytest_distperf.output.benchmark_session import add_benchmark


@pytest.fixture
def measured(request):
    slower = float(os.environ.get("SLOWER", "1"))
    totals = tuple(slower * t for t in (0.50, 0.52, 0.49, 0.55, 0.51))
    result, record = make_run(request.node.nodeid, totals)
    request.config.pluginmanager.get_plugin("distperf-session").records.append(record)
    added = add_benchmark(request.node, record, occurrence=1)
    assert added == (os.environ.get("EXPECT_ADDED", "1") == "1")
    if added:
        assert add_benchmark(request.node, record, occurrence=2)
"""

BRIDGE_TEST = """
import pytest

@pytest.mark.parametrize("strategy", ["auto"])
def test_gen(measured, strategy):
    pass
"""


@pytest.fixture
def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """`run(*args, pool=None, **env)`: pytest in a subprocess, in pytester's directory, with
    `env` set; `pool`: in the suite's shared ranks at that address."""

    def run(*args: str, pool: str | None = None, **env: str) -> pytest.RunResult:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        shared = use_shared_pool(monkeypatch, pool) if pool else ()
        return pytester.runpytest_subprocess(*shared_cache(), *shared, *args)

    return run


@pytest.mark.slow
def test_pytest_benchmark_saves_compares_and_fails_on_distperf_rounds(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    pytester.makeconftest(BRIDGE_CONFTEST)
    pytester.makepyfile(BRIDGE_TEST)
    storage = pytester.path / "bench-store"
    exported = pytester.path / "bench.json"
    saved = run(
        "--benchmark-autosave", f"--benchmark-storage={storage}", f"--benchmark-json={exported}"
    )
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["*benchmark '*::test_gen': 2 tests*", "*test_gen[[]auto[]]*"])
    [file] = list(storage.rglob("0001_*.json"))
    document = json.loads(exported.read_text())
    stored = json.loads(file.read_text())[
        "benchmarks"
    ]  # the rounds only with --benchmark-save-data
    assert [b["stats"]["median"] for b in stored] == [
        b["stats"]["median"] for b in document["benchmarks"]
    ]
    first, second = document["benchmarks"]
    assert first["fullname"].endswith("::test_gen[auto]") and first["param"] == "auto"
    assert second["fullname"] == first["fullname"] + " #2"
    assert first["group"].endswith("::test_gen")
    assert first["params"]["strategy"] == "auto" and first["params"]["devices"] == 2
    assert first["stats"]["data"] == pytest.approx([0.50, 0.52, 0.49, 0.55, 0.51])
    assert first["stats"]["median"] == pytest.approx(0.51) and first["stats"]["rounds"] == 5
    assert first["extra_info"]["tokens_per_sec"] == pytest.approx(32 / 0.51)
    assert document["machine_info"][MACHINE_INFO_KEY]["topology_keys"] == [
        "cpu_x2_loopbackx1_2cpus"
    ]
    assert document["commit_info"]  # pytest-benchmark's own

    compare = ("--benchmark-compare", "--benchmark-compare-fail=median:5%")
    unchanged = run(*compare, f"--benchmark-storage={storage}", SLOWER="1.02")
    assert unchanged.ret == 0, unchanged.stdout.str()
    # the distperf part of the saved machine info is not this machine's at load time
    assert "machine_info is different" not in unchanged.stdout.str() + unchanged.stderr.str()
    slowed = run(*compare, f"--benchmark-storage={storage}", SLOWER="1.2")
    assert slowed.ret != 0
    slowed.stderr.fnmatch_lines(["*Performance has regressed*"])
    output = slowed.stdout.str() + slowed.stderr.str()
    assert "Field 'median' has failed PercentageRegressionCheck: 20.0" in output

    # pytest-benchmark's own command reads the saved file
    done = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "compare", str(file), "--group-by=name"],
        cwd=pytester.path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "test_gen[auto] #2" in done.stdout


# find_spec, not importorskip: importing pygal here (it pulls in importlib_metadata) left the later
# in-process pytester sessions of this run without the distperf plugin.
@pytest.mark.skipif(
    importlib.util.find_spec("pygal") is None,
    reason="--benchmark-histogram needs pytest-benchmark[histogram]",
)
def test_pytest_benchmark_histogram_draws_distperf_rounds(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    pytester.makeconftest(BRIDGE_CONFTEST)
    pytester.makepyfile(BRIDGE_TEST)
    run(f"--benchmark-histogram={pytester.path / 'hist'}").assert_outcomes(passed=1)
    [svg] = pytester.path.glob("hist-*test_gen.svg")
    assert "test_gen[auto] #2" in svg.read_text()


@pytest.mark.parametrize(
    "args", [("--benchmark-disable",), ("-p", "no:benchmark")], ids=["disabled", "not-loaded"]
)
def test_nothing_is_added_without_a_recording_session(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult], args: tuple[str, ...]
) -> None:
    pytester.makeconftest(BRIDGE_CONFTEST)
    pytester.makepyfile(BRIDGE_TEST)
    run(*args, EXPECT_ADDED="0").assert_outcomes(passed=1)


# --- real ranks ------------------------------------------------------------------------------

# Each forward takes a steady extra time (a sleep, as a GPU's step would), so that 10% is far
# above a shared CPU's noise; SLOW_ATTENTION_S=0.005 adds 20 ms (2 layers x 2 forwards) to a
# generation of about 45 ms.
SLOW_ATTENTION_BUILDER = """
import os
import time

from distperf_model.config import Config
from distperf_model.model import CausalSelfAttention, build_model

STEADY_S = 0.02


def build(seed, device, dtype):
    model = build_model(Config.from_name("tiny"), seed, device, dtype)
    model.register_forward_pre_hook(lambda *_: time.sleep(STEADY_S))
    delay = float(os.environ.get("SLOW_ATTENTION_S", "0"))
    if delay:
        for module in model.modules():
            if isinstance(module, CausalSelfAttention):
                module.register_forward_pre_hook(lambda *_: time.sleep(delay))
    return model
"""

SLOW_ATTENTION_TEST = """
import pytest

@pytest.mark.distperf(model="slowattention:build", max_new_tokens=2)
def test_generate(distperf):
    distperf.run()
"""

# pytest-benchmark compares the rounds alone: no counted generation after them
RANKS = ("--distperf-devices=2", "--distperf-accelerator=cpu", "--distperf-repeats=5")
NOT_COUNTED = "--distperf-count=off"


@pytest.mark.slow
def test_benchmark_compare_fail_catches_slower_attention(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult], shared_pool: str
) -> None:
    pytester.makepyfile(slowattention=SLOW_ATTENTION_BUILDER)
    pytester.makepyfile(SLOW_ATTENTION_TEST)
    storage = f"--benchmark-storage={pytester.path / 'bench-store'}"
    # Saved in the suite's shared ranks; the slowed run in its own (they read the delay).
    saved = run(*RANKS, NOT_COUNTED, "--benchmark-autosave", storage, pool=shared_pool)
    saved.assert_outcomes(passed=1)
    saved.stdout.fnmatch_lines(["*distperf results*", "*test_generate[[]auto-2cpu[]]*"])
    [file] = list((pytester.path / "bench-store").rglob("0001_*.json"))
    [bench] = json.loads(file.read_text())["benchmarks"]
    assert bench["fullname"] == "test_benchmark_compare_fail_catches_slower_attention.py::" + (
        "test_generate[auto-2cpu]"
    )
    assert bench["stats"]["rounds"] == 5 and bench["extra_info"]["strategy"] == "auto"
    assert bench["extra_info"]["topology_key"].startswith("cpu_")

    compare = ("--benchmark-compare", "--benchmark-compare-fail=median:10%", storage, NOT_COUNTED)
    slowed = run(*RANKS, *compare, SLOW_ATTENTION_S="0.005")
    assert slowed.ret != 0
    # The test passed (distperf's gates have no baseline here); pytest-benchmark's own check
    # raised after it, so pytest printed no closing counts line.
    slowed.stdout.fnmatch_lines(["*auto*2 x cpu*ok*test_generate[[]auto-2cpu[]]"])
    slowed.stderr.fnmatch_lines(
        ["*Performance has regressed*", "*test_generate[[]auto-2cpu[]]*Field 'median' has failed*"]
    )


TINY_TEST = """
import pytest

@pytest.mark.distperf(model="tiny", max_new_tokens=4, gates=False)
def test_generate(distperf):
    distperf.run()
"""


@pytest.mark.slow
def test_distperf_works_without_pytest_benchmark(
    pytester: pytest.Pytester, run: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(TINY_TEST)
    report = pytester.path / "report.json"
    result = run("-p", "no:benchmark", *RANKS[:2], f"--distperf-json={report}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*distperf results*", "*auto*2 x cpu*test_generate*"])
    result.stdout.no_fnmatch_line("benchmark: *")  # pytest-benchmark's header line
    [row] = json.loads(report.read_text())["results"]
    assert row["strategy"] == "auto" and len(row["tokens_per_sec_samples"]) == 5
