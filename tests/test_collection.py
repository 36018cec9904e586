"""Collection stays cheap and exact: no torch, no probe before deselection, the report header,
and strategies that cannot run where the session runs (skip or fail before any rank starts)."""

from __future__ import annotations

import json

import pytest

from pytest_distperf.judge.gate import session_message_sizes
from pytest_distperf.platform import CPU
from pytest_distperf.spec import Workload

TWO_TESTS = """
import pytest

@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=4)
def test_small(distperf):
    pass

@pytest.mark.strategy("fsdp")
@pytest.mark.devices(2, 3)
@pytest.mark.distperf(model="pythia-14m", max_new_tokens=4)
def test_big(distperf):
    pass
"""

# Says at the very end of the session whether torch was imported, and what the plugin chose to
# measure (rank count -> [all-gather sizes, all-reduce sizes]) and whether it probed.
REPORTING_CONFTEST = """
import json, sys

def pytest_unconfigure(config):
    plugin = config.pluginmanager.get_plugin("distperf-session")
    sizes = {
        str(count): [list(s.all_gather), list(s.all_reduce)] if s else None
        for count, s in plugin.calibration_sizes.items()
    }
    print("REPORT", json.dumps({
        "torch": "torch" in sys.modules, "sizes": sizes, "probed": plugin._gate is not None,
    }))
"""


def _report(result: pytest.RunResult) -> dict:
    [line] = [line for line in result.outlines if line.startswith("REPORT ")]
    return json.loads(line.removeprefix("REPORT "))


@pytest.mark.parametrize("args", [["--collect-only"], ["--collect-only", "-q"], ["--help"]])
def test_collect_only_and_help_import_no_torch(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makeconftest(REPORTING_CONFTEST)
    pytester.makepyfile(TWO_TESTS)
    # A fresh interpreter: this process imported torch long ago (tests/conftest.py).
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0
    report = _report(result)
    assert report["torch"] is False
    assert report["probed"] is False and report["sizes"] == {}  # nothing will run


def test_collect_only_keeps_the_ids(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TWO_TESTS)
    result = pytester.runpytest_subprocess("--collect-only", "-q", "--distperf-accelerator=cpu")
    result.stdout.fnmatch_lines(
        ["*test_small[[]fsdp-2cpu[]]", "*test_big[[]fsdp-2cpu[]]", "*test_big[[]fsdp-3cpu[]]"]
    )


def _expected(model: str, devices: int) -> list[list[int]]:
    """What CPU ranks calibrate for it: up to their largest message."""
    workloads = [("fsdp", Workload(model=model, max_new_tokens=4))]
    sizes = session_message_sizes(workloads, devices, CPU.calibration_max_bytes)
    assert sizes is not None
    return [list(sizes.all_gather), list(sizes.all_reduce)]


def test_k_calibrates_only_what_the_selected_tests_need(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(REPORTING_CONFTEST)
    pytester.makepyfile(TWO_TESTS)
    selected = pytester.runpytest("--distperf-accelerator=cpu", "-k", "test_small")
    selected.assert_outcomes(passed=1, deselected=2)
    assert _report(selected)["sizes"] == {"2": _expected("tiny", 2)}
    selected.stdout.fnmatch_lines(
        [
            "distperf: topology cpu_*: links LOOPBACK (from cpu)",
            "distperf: calibration in the first run of each rank count: 2 ranks: "
            f"{len(_expected('tiny', 2)[0])} all-gather and * all-reduce sizes",
        ]
    )

    everything = pytester.runpytest("--distperf-accelerator=cpu")
    everything.assert_outcomes(passed=3)
    tiny, pythia = _expected("tiny", 2), _expected("pythia-14m", 2)
    union = [sorted(set(tiny[kind]) | set(pythia[kind])) for kind in (0, 1)]
    assert _report(everything)["sizes"] == {"2": union, "3": _expected("pythia-14m", 3)}
    # the model's largest gather (51 MB on 3 ranks) is left out: seconds over loopback
    whole = session_message_sizes([("fsdp", Workload(model="pythia-14m"))], 3)
    assert CPU.calibration_max_bytes is not None
    assert whole is not None and max(whole.all_gather) > CPU.calibration_max_bytes


def test_no_selected_distperf_test_probes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(REPORTING_CONFTEST)
    pytester.makepyfile(TWO_TESTS + "\n\ndef test_plain():\n    pass\n")
    result = pytester.runpytest("--distperf-accelerator=cpu", "-k", "test_plain")
    result.assert_outcomes(passed=1, deselected=3)
    assert _report(result) == {"torch": True, "sizes": {}, "probed": False}
    assert not [line for line in result.outlines if line.startswith("distperf: topology cpu_")]


def test_header_names_accelerator_ranks_topology_and_calibration(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = pytester.runpytest("--distperf-accelerator=cpu", "--distperf-devices=3")
    result.stdout.fnmatch_lines(
        [
            "distperf: accelerator cpu, 3 ranks per test, 5 repeats after 1 warm-up",
            "distperf: topology probed when the first distperf test runs; "
            "calibration not yet (calibrated in the first run of each rank count)",
        ]
    )
    saved = pytester.path / "topo.json"
    result = pytester.runpytest(f"--distperf-topology={saved}", "--distperf-accelerator=cuda")
    result.stdout.fnmatch_lines(
        [
            "distperf: accelerator cuda (* GPU(s) visible), 2 ranks per test, *",
            f"distperf: topology from {saved}, loaded when the first distperf test runs; *",
        ]
    )


def test_quiet_run_prints_no_collection_lines(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TWO_TESTS)
    result = pytester.runpytest("--distperf-accelerator=cpu", "-q", "-k", "test_small")
    assert not [line for line in result.outlines if line.startswith("distperf: ")]


# Strategies no built-in record refuses yet: one that runs on CUDA only, one that needs 2 ranks.
FAKE_STRATEGIES = """
import dataclasses
from pytest_distperf.strategies import STRATEGIES

def pytest_configure(config):
    base = STRATEGIES["auto"]
    STRATEGIES["cuda-only"] = dataclasses.replace(
        base, name="cuda-only", runs_on=frozenset({"cuda"})
    )
    STRATEGIES["pair"] = dataclasses.replace(base, name="pair", min_ranks=2)

def pytest_unconfigure(config):
    STRATEGIES.pop("cuda-only", None)
    STRATEGIES.pop("pair", None)
"""


def test_strategy_that_cannot_run_here_skips_or_fails_before_ranks_start(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(FAKE_STRATEGIES)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.strategy("cuda-only")
        def test_cuda_only(distperf):
            distperf.run()

        @pytest.mark.strategy("pair")
        @pytest.mark.devices(1)
        def test_one_of_a_pair(distperf):
            distperf.run()

        @pytest.mark.strategy("pair")
        def test_pair_on_the_session_count(distperf):
            distperf.run()
        """
    )
    result = pytester.runpytest("--distperf-accelerator=cpu", "--distperf-devices=1", "-rs")
    # The session's accelerator and --distperf-devices may suit these elsewhere: skipped.
    # A rank count from the test's own marker never can: its own failure, at setup.
    result.assert_outcomes(skipped=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_one_of_a_pair[[]pair-1cpu[]]: strategy 'pair' needs at least 2 ranks, got 1",
            "SKIPPED*distperf: strategy 'cuda-only' runs on cuda, not on 'cpu'",
            "SKIPPED*distperf: strategy 'pair' needs at least 2 ranks, got 1",
        ]
    )
