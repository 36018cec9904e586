"""Under pytest-xdist (-n) every distperf test runs on one worker and the controller reports all."""

from __future__ import annotations

import json
import re
from types import MappingProxyType

import pytest

from pytest_distperf import xdist

pytest.importorskip("xdist")

# Many distperf items without ranks (the bodies never call run()) beside plain tests: enough
# items that xdist's load scheduling would spread them over both workers.
MANY = """
import pytest

@pytest.mark.strategy("auto", "ddp", "fsdp", "fsdp2")
@pytest.mark.devices(1, 2)
def test_perf(distperf):
    pass

@pytest.mark.parametrize("n", range(8))
def test_plain(n):
    pass
"""


def _workers(result: pytest.RunResult, pattern: str) -> dict[str, str]:
    """node id -> the worker that ran it, from -v output ("[gw0] [ 10%] PASSED id")."""
    found = {}
    for line in result.outlines:
        m = re.match(r"\[(gw\d+)\] \[ *\d+%\] \w+ (\S+)", line)
        if m and pattern in m.group(2):
            found[m.group(2)] = m.group(1)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["load", "loadgroup", "loadscope", "loadfile"])
def test_every_distperf_test_runs_on_one_worker(pytester: pytest.Pytester, mode: str) -> None:
    pytester.makepyfile(test_a=MANY, test_b=MANY.replace("test_perf", "test_perf_b"))
    args = ("-p", "xdist", "-n", "2", "--dist", mode, "-v", "--distperf-accelerator=cpu")
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=32)
    result.stdout.fnmatch_lines([f"distperf: pytest-xdist --dist {mode}: all distperf tests*"])
    ran_on = _workers(result, "::test_perf")
    assert len(ran_on) == 16 and len(set(ran_on.values())) == 1, ran_on


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["each", "worksteal"])
def test_modes_that_cannot_keep_tests_together_fail_the_distperf_tests(
    pytester: pytest.Pytester, mode: str
) -> None:
    pytester.makepyfile(MANY)
    result = pytester.runpytest("-p", "xdist", "-n", "2", "--dist", mode)
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] == 8 * (2 if mode == "each" else 1)
    assert outcomes["errors"] == 8 * (2 if mode == "each" else 1)
    result.stdout.fnmatch_lines(
        [
            f"distperf: pytest-xdist --dist {mode} cannot keep distperf tests on one worker*",
            f"distperf: under pytest-xdist --dist {mode}, distperf tests would run on several "
            "workers at once and start ranks on the same devices; use --dist load*",
        ]
    )


def test_one_worker_runs_them_in_any_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MANY)
    result = pytester.runpytest("-p", "xdist", "-n", "1", "--dist", "each")
    result.assert_outcomes(passed=16)


def test_records_travel_as_they_are() -> None:
    from pytest_distperf.xdist import Payload, _dumps

    versions = MappingProxyType({"torch": "2.13.0"})
    payload = Payload(records=({"versions": versions},), topology=None)
    report = pytest.TestReport("t", ("t.py", 0, "t"), {}, "passed", None, "call")
    xdist.attach(report, payload)
    assert isinstance(getattr(report, xdist.REPORT_KEY), bytes)
    back = xdist.detach(report)
    assert isinstance(back, Payload)
    assert back.records[0]["versions"] == versions
    assert isinstance(back.records[0]["versions"], MappingProxyType)
    assert _dumps(payload)  # the same bytes path the worker takes


def test_unpicklable_records_are_named_not_lost_silently() -> None:
    report = pytest.TestReport("t.py::t", ("t.py", 0, "t"), {}, "passed", None, "call")
    xdist.attach(report, xdist.Payload(records=(lambda: None,), topology=None))
    text = xdist.detach(report)
    assert isinstance(text, str) and text.startswith("t.py::t: its distperf results could not")


@pytest.mark.parametrize(
    ("nodeid", "plain"),
    [
        ("t.py::test[fsdp-2cpu]@distperf", "t.py::test[fsdp-2cpu]"),
        ("t.py::test[a@b]", "t.py::test[a@b]"),
        ("dir@x/t.py::test", "dir@x/t.py::test"),
        ("t.py::test", "t.py::test"),
    ],
)
def test_plain_nodeid_drops_only_a_group_suffix(nodeid: str, plain: str) -> None:
    assert xdist.plain_nodeid(nodeid) == plain


TWO_STRATEGIES = """
import pytest

@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="tiny", max_new_tokens=4, gates=False)
def test_rate(distperf):
    distperf.run()

@pytest.mark.parametrize("n", range(4))
def test_plain(n):
    pass
"""


@pytest.mark.slow
def test_controller_writes_every_workers_results(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TWO_STRATEGIES)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "xdist",
        "-n",
        "2",
        "-v",
        "--distperf-accelerator=cpu",
        "--distperf-repeats=2",
        f"--distperf-json={report}",
    )
    result.assert_outcomes(passed=6)
    ran_on = _workers(result, "::test_rate")
    assert len(ran_on) == 2 and len(set(ran_on.values())) == 1, ran_on
    rows = json.loads(report.read_text())["results"]
    module = "test_controller_writes_every_workers_results.py"
    assert sorted(row["test_id"] for row in rows) == [
        f"{module}::test_rate[auto-2cpu]",
        f"{module}::test_rate[fsdp-2cpu]",
    ]
    assert all(row["tokens_per_sec"] > 0 and row["topology_key"] for row in rows)
    result.stdout.fnmatch_lines(
        [
            "*distperf results*",
            "topology cpu_*: links LOOPBACK (from cpu)*",
            "*auto*2 x cpu*test_rate[[]auto-2cpu[]]",
            "*fsdp*2 x cpu*test_rate[[]fsdp-2cpu[]]",
        ]
    )
