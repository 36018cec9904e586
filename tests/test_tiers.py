"""The fast tier starts no rank process: tests/conftest.py names each test not marked `slow`
in DISTPERF_FORBID_RANKS, and the pool, the launchers and the early start refuse there
(tests/rank_guard.py)."""

from __future__ import annotations

import os

import pytest
from helpers import spawn_gloo_ranks
from rank_guard import FORBID_RANKS, ranks_forbidden, refuse_ranks

from pytest_distperf.spec import RunSpec, Workload

SPEC = RunSpec(
    test_id="t.py::test_x",
    strategy="replicated",
    devices=2,
    accelerator="cpu",
    workload=Workload(model="tiny", max_new_tokens=2),
    repeats=1,
    warmup=0,
    timeout=60.0,
)

RUNNING_TEST = """
import pytest

@pytest.mark.distperf(model="tiny", max_new_tokens=2)
def test_runs(distperf):
    distperf.run()

@pytest.mark.distperf(model="tiny", max_new_tokens=2)
def test_collected_only(distperf):
    pass
"""

POOLS_REPORT = """
def pytest_unconfigure(config):
    pools = config.pluginmanager.get_plugin("distperf-session").pools
    print("POOL", pools and pools.current)
"""


def test_refusal_names_the_test() -> None:
    assert ranks_forbidden({}) is None and ranks_forbidden({FORBID_RANKS: ""}) is None
    refuse_ranks({})  # allowed: returns
    with pytest.raises(RuntimeError) as info:
        refuse_ranks({FORBID_RANKS: "tests/test_a.py::test_b"})
    assert str(info.value) == (
        "rank processes are not allowed in tests/test_a.py::test_b: mark it slow"
    )


def test_an_unmarked_test_is_named(request: pytest.FixtureRequest) -> None:
    assert os.environ[FORBID_RANKS] == request.node.nodeid


@pytest.mark.slow
def test_a_slow_test_may_start_ranks() -> None:
    assert ranks_forbidden() is None


def test_the_pool_and_the_launchers_refuse(request: pytest.FixtureRequest) -> None:
    from pytest_distperf.launch.elastic import launch
    from pytest_distperf.launch.failures import RunFailed
    from pytest_distperf.launch.job import run_in_job
    from pytest_distperf.launch.pool import PoolKey, Pools, RankPool

    refusal = f"rank processes are not allowed in {request.node.nodeid}: mark it slow"
    for start in (lambda: RankPool(PoolKey("cpu", 2)), lambda: launch(SPEC)):
        with pytest.raises(RuntimeError, match=refusal.replace("[", r"\[")):
            start()
    with pytest.raises(RuntimeError, match="mark it slow"):
        run_in_job(SPEC)
    with pytest.raises(RuntimeError, match="mark it slow"):
        spawn_gloo_ranks(print)  # the tests' own gloo ranks
    pools = Pools()
    pools.start(PoolKey("cpu", 2))  # the early start: quietly nothing
    assert pools.current is None
    with pytest.raises(RunFailed, match="could not start the ranks.*mark it slow"):
        pools.run(SPEC)


def test_a_nested_session_is_refused_too(pytester: pytest.Pytester) -> None:
    """The session starts no pool ahead of its tests; the one that asks for ranks fails with
    the refusal, the one that only takes the fixture passes."""
    pytester.makepyfile(RUNNING_TEST)
    # In a process of its own, the session loads the guard from PYTEST_PLUGINS.
    result = pytester.runpytest_subprocess("--distperf-accelerator=cpu", "--distperf-devices=2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*rank processes are not allowed in *test_a_nested_session*"])
    pytester.makeconftest(POOLS_REPORT)
    collected_only = pytester.runpytest("--distperf-accelerator=cpu", "-k", "collected")
    collected_only.assert_outcomes(passed=1, deselected=1)
    collected_only.stdout.fnmatch_lines(["POOL None"])
