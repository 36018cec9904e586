"""The gates end to end on CPU ranks: threshold, baselines, reports, and their bad inputs.

The healthy runs are judged at the default thresholds. One fixture records a baseline, compares
an unchanged run with it (with --distperf-strict), then a run slowed to a tenth of its rate;
the tests read what those three sessions left. A test without a baseline under
--distperf-strict needs no ranks: the launcher is faked."""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from helpers import FAKE_LAUNCH_CONFTEST, run_session, write_files

# `auto` with its relative speed asked for: the bare model timed beside each repeat (its
# reference too); pythia-14m, whose head sets most of its compute: tiny's rate is set by
# per-call overheads that the bare model beside it does not pay.
TEST_RATE = """
import pytest

@pytest.mark.distperf(model="pythia-14m", max_new_tokens=12, relative_speed=True)
def test_rate(distperf):
    distperf.run()
"""

UNRECORDED = TEST_RATE.replace("test_rate", "test_unrecorded")
RANKS = "--distperf-devices=2"


def _baseline_files(root: Path) -> list[Path]:
    return sorted((root / "distperf-baselines").glob("*.json"))


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory, shared_pool: str) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("gated")
    write_files(path, test_rate=TEST_RATE)
    record = (RANKS, "--distperf-update-baselines")
    sessions: dict[str, Any] = {"recorded": run_session(path, *record, pool=shared_pool)}
    sessions["first entry"] = json.loads(_baseline_files(path)[0].read_text())
    # Two more recorded sessions: this VM's core speed moved by up to 30% between sessions a
    # few seconds apart, which one recorded run's tolerance (its repeats' noise) cannot hold.
    for _ in range(2):
        run_session(path, *record, pool=shared_pool)
    same = (RANKS, "--junitxml=junit.xml", "--distperf-strict")
    sessions["same"] = run_session(path, *same, pool=shared_pool)
    # A tenth of the rate, against a tolerance fixed at 60%.
    slowed = (RANKS, "--distperf-tolerance=0.6", "test_rate.py")
    sessions["slowed"] = run_session(
        path, *slowed, env={"DISTPERF_SLOWDOWN": "0.9"}, pool=shared_pool
    )
    return sessions


@pytest.mark.slow
def test_a_healthy_run_is_recorded_as_the_baseline(gated: dict[str, Any]) -> None:
    recorded = gated["recorded"]
    recorded.assert_outcomes(passed=1)
    [(test_id, entry)] = gated["first entry"]["entries"].items()
    assert test_id.startswith("test_rate.py::test_rate[auto-2cpu] [")
    assert "model=pythia-14m" in test_id and "slowdown" not in test_id
    assert len(entry["samples"]) == 5
    assert entry["run_medians"] == [entry["median"]]  # the first recorded run of this test
    # The bare model ran beside each repeat: the run's speed relative to it is recorded too.
    assert len(entry["relative_samples"]) == 5 and all(v > 0 for v in entry["relative_samples"])


@pytest.mark.slow
def test_an_unchanged_run_passes_against_its_baseline(gated: dict[str, Any]) -> None:
    same = gated["same"]
    same.assert_outcomes(passed=1)  # with --distperf-strict: it has a baseline
    # at the default tolerance, from the three recorded runs' drift
    same.result.stdout.fnmatch_lines(["*auto*2 x cpu*[+-]*%*test_rate[[]auto-2cpu[]]"])
    [baseline] = _baseline_files(same.path)
    [entry] = json.loads(baseline.read_text())["entries"].values()
    junit = ET.parse(same.path / "junit.xml")
    [case] = [c for c in junit.iter("testcase") if c.get("name") == "test_rate[auto-2cpu]"]
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert float(properties["distperf_tokens_per_sec"]) > 0
    # from three recorded runs the level is their runs' median (judge/tolerance.py)
    level = statistics.median(entry["run_medians"])
    assert len(entry["run_medians"]) == 3
    assert float(properties["distperf_baseline_tokens_per_sec"]) == pytest.approx(level)
    assert properties["distperf_topology_key"] == baseline.stem
    assert float(properties["distperf_relative_speed"]) > 0


@pytest.mark.slow
def test_a_slowed_run_fails_its_baseline(gated: dict[str, Any]) -> None:
    slowed = gated["slowed"]
    slowed.assert_outcomes(failed=1)
    # replicated decode exchanges no collectives: its threshold is a note, the baseline fails it
    slowed.result.stdout.no_fnmatch_line("*distperf threshold check failed:*")
    slowed.result.stdout.fnmatch_lines(
        [
            "*distperf baseline check failed:*",
            "*throughput regression: measured median * tok/s (n=5) vs baseline * tok/s "
            "(n=5, the median of 3 recorded runs); change -*% (tolerance 60.0%)*smallest "
            "detectable drop*",
            "*measured outside the rank: *",
        ]
    )


# --- no ranks: bad inputs, and a baseline file that is not one (the launcher faked) ---------


def test_corrupt_baseline_file_is_named_and_left_untouched(pytester: pytest.Pytester) -> None:
    from pytest_distperf.store.entry import BaselineEntry
    from pytest_distperf.store.store import BaselineStore
    from pytest_distperf.topology import probe

    pytester.makeconftest(FAKE_LAUNCH_CONFTEST)
    pytester.makepyfile(TEST_RATE)
    # This machine's baseline file for the test, as a session would record it, then truncated.
    key = probe("cpu", 2).key()
    entry = BaselineEntry.from_samples("t.py::test_rate", [100.0, 101.0, 99.0], None, {})
    BaselineStore(pytester.path / "distperf-baselines").save(key, {entry.test_id: entry}, {})
    [baseline] = _baseline_files(pytester.path)
    assert baseline.stem == key
    truncated = baseline.read_bytes()[:40]
    baseline.write_bytes(truncated)
    for args in ([], ["--distperf-update-baselines"]):
        result = pytester.runpytest(
            RANKS, "--distperf-accelerator=cpu", "-p", "no:benchmark", *args
        )
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"*baseline file {baseline}*"])
        assert baseline.read_bytes() == truncated


def test_strict_fails_without_baseline_and_names_the_key(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(FAKE_LAUNCH_CONFTEST)
    pytester.makepyfile(UNRECORDED)
    args = (RANKS, "--distperf-accelerator=cpu", "-p", "no:benchmark", "--distperf-strict")
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_unrecorded[[]auto-2cpu[]] _*",
            "distperf baseline check failed:",
            "no baseline for this test on this machine (topology key cpu_*)*",
        ]
    )


def test_bad_topology_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_RATE)
    missing = pytester.path / "nowhere.json"
    result = pytester.runpytest(RANKS, f"--distperf-topology={missing}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--distperf-topology*{missing}*"])


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2", "fast"])
def test_bad_efficiency_is_a_usage_error(pytester: pytest.Pytester, bad: str) -> None:
    pytester.makepyfile(TEST_RATE)
    result = pytester.runpytest(f"--distperf-efficiency={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--distperf-efficiency*{bad}*"])


def test_bad_efficiency_in_marker_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_RATE.replace("max_new_tokens=12", "max_new_tokens=12, efficiency=2"))
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)  # at setup: no rank starts
    result.stdout.fnmatch_lines(
        ["*test_rate: distperf(efficiency=2): efficiency must be in (0, 1]*"]
    )


def test_topology_of_another_accelerator_is_a_usage_error(pytester: pytest.Pytester) -> None:
    from pytest_distperf.topology import parse_nvidia_smi_topo

    text = (Path(__file__).parent / "data/topologies/topo_2x_h200_nv18.txt").read_text()
    saved = pytester.path / "gpu.json"
    saved.write_text(json.dumps(parse_nvidia_smi_topo(text).to_dict()))
    pytester.makepyfile(TEST_RATE)
    result = pytester.runpytest(RANKS, "--distperf-accelerator=cpu", f"--distperf-topology={saved}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu.json describes cuda devices but the ranks run on cpu*"])
