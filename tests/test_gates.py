"""The gates end to end on CPU ranks: threshold, baselines, reports, and their bad inputs."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# `auto` is predicted from the bare model timed beside each repeat (more than 8 new tokens), so
# its threshold holds even for the tiny model, whose rate per-call overheads set; efficiency 0.2
# leaves room for a busy CI host, and the slow-down knob below still falls far under it.
TEST_AUTO = """
import pytest

@pytest.mark.distperf(model="tiny", max_new_tokens=12, efficiency=0.2)
def test_rate(distperf):
    distperf.run()
"""


def _baseline_files(root: Path) -> list[Path]:
    return sorted((root / "distperf-baselines").glob("*.json"))


def test_slowdown_knob_fails_the_threshold_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(TEST_AUTO)  # which passes unslowed: the recorded run below
    monkeypatch.setenv("DISTPERF_SLOWDOWN", "0.9")
    result = pytester.runpytest_subprocess("--distperf-devices=2")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*distperf threshold check failed:*",
            "*auto (replicated) on 2 device(s): measured * tok/s is below the threshold "
            "* tok/s (20% of the predicted * tok/s); measured/predicted = 0.*",
            "*bound by compute*",
        ]
    )


def test_record_then_compare_then_catch_a_regression(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(TEST_AUTO)
    recorded = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-update-baselines")
    recorded.assert_outcomes(passed=1)
    [baseline] = _baseline_files(pytester.path)
    entries = json.loads(baseline.read_text())["entries"]
    [(test_id, entry)] = entries.items()
    assert test_id.startswith("test_record_then_compare_then_catch_a_regression.py::test_rate")
    assert "model=tiny" in test_id and "slowdown" not in test_id
    assert len(entry["samples"]) == 5
    assert entry["run_medians"] == [entry["median"]]  # the first recorded run of this test
    # The bare model ran beside each repeat: the run's speed relative to it is recorded too.
    assert len(entry["relative_samples"]) == 5 and all(v > 0 for v in entry["relative_samples"])

    junit = pytester.path / "junit.xml"
    # A tiny model on two shared cores moves by up to a third between runs (seen once in this
    # suite); the test is about the mechanics, so the unchanged run gets a wide tolerance (60%)
    # and the regression below (90%: a tenth of the rate) lies far beyond it.
    same = pytester.runpytest_subprocess(
        "--distperf-devices=2", f"--junitxml={junit}", "--distperf-tolerance=0.6"
    )
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*auto*2 x cpu*compute*[+-]*%*test_rate[[]auto-2cpu[]]"])
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert float(properties["distperf_tokens_per_sec"]) > 0
    assert float(properties["distperf_baseline_tokens_per_sec"]) == entry["median"]
    assert properties["distperf_topology_key"] == baseline.stem
    assert float(properties["distperf_relative_speed"]) > 0

    monkeypatch.setenv("DISTPERF_SLOWDOWN", "0.9")
    caught = pytester.runpytest_subprocess(
        "--distperf-devices=2", "--distperf-efficiency=0.01", "--distperf-tolerance=0.6"
    )
    caught.assert_outcomes(failed=1)
    caught.stdout.fnmatch_lines(
        [
            "*distperf baseline check failed:*",
            "*throughput regression: measured median * tok/s (n=5) vs baseline median "
            "* tok/s (n=5); change -*% (tolerance *%)*smallest detectable drop*",
            "*distperf relative_speed check failed:*",
            "*relative speed regression: measured median * x bare (n=5) vs baseline median "
            "* x bare (n=5); change -*%*the host's own speed cancels out)",
        ]
    )


def test_strict_fails_without_baseline_and_names_the_key(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_AUTO)
    result = pytester.runpytest_subprocess("--distperf-devices=2", "--distperf-strict")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*no baseline for this test on this machine (topology key cpu_*)*"]
    )


def test_corrupt_baseline_file_is_named_and_left_untouched(pytester: pytest.Pytester) -> None:
    from pytest_distperf.store.entry import BaselineEntry
    from pytest_distperf.store.store import BaselineStore
    from pytest_distperf.topology import probe

    pytester.makepyfile(TEST_AUTO)
    # This machine's baseline file for the test, as a session would record it, then truncated.
    key = probe("cpu", 2).key()
    entry = BaselineEntry.from_samples("t.py::test_rate", [100.0, 101.0, 99.0], None, {})
    BaselineStore(pytester.path / "distperf-baselines").save(key, {entry.test_id: entry}, {})
    [baseline] = _baseline_files(pytester.path)
    assert baseline.stem == key
    truncated = baseline.read_bytes()[:40]
    baseline.write_bytes(truncated)
    for args in ([], ["--distperf-update-baselines"]):
        result = pytester.runpytest_subprocess("--distperf-devices=2", *args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"*baseline file {baseline}*"])
        assert baseline.read_bytes() == truncated


def test_bad_topology_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_AUTO)
    missing = pytester.path / "nowhere.json"
    result = pytester.runpytest_subprocess("--distperf-devices=2", f"--distperf-topology={missing}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--distperf-topology*{missing}*"])


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.2", "fast"])
def test_bad_efficiency_is_a_usage_error(pytester: pytest.Pytester, bad: str) -> None:
    pytester.makepyfile(TEST_AUTO)
    result = pytester.runpytest(f"--distperf-efficiency={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--distperf-efficiency*{bad}*"])


def test_bad_efficiency_in_marker_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TEST_AUTO.replace("efficiency=0.2", "efficiency=2"))
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
    pytester.makepyfile(TEST_AUTO)
    result = pytester.runpytest_subprocess(
        "--distperf-devices=2", "--distperf-accelerator=cpu", f"--distperf-topology={saved}"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*gpu.json describes cuda devices but the ranks run on cpu*"])
