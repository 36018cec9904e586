"""The verdict matrix end to end on 2 CPU ranks, every gate at its default: one session records
the baselines of a model from a plain builder and of a user's own loop, a second runs each with
the regression its builder names (docs/benchmarks/cpu/verdict_models.py, VERDICT_REGRESSED=1):
the timed ones gross, which one recorded run fails, the counted ones any size. Each must fail,
and none may be forgiven as a busy machine: the ranks waited (a sleep, a peer, a host sync) or
did more, and nothing outside them took their time. The 10-20-session figures:
docs/benchmarks/cpu-2026-12-06-verdicts.md."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import Session, run_session

MODELS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "cpu" / "verdict_models.py"
SUITE = """
import pytest

def _case(model, **loop):
    @pytest.mark.distperf(model=f"verdict_models:{model}", max_new_tokens=8, **loop)
    def test(distperf):
        distperf.run()
    return test

test_waits = _case("waits")
test_computes = _case("computes")
test_slow_rank = _case("slow_rank")
test_collective = _case("collective")
test_host_sync = _case("plain", generate="verdict_models:greedy_syncing")
"""
RANKS = ("--distperf-devices=2", "--distperf-accelerator=cpu", "--distperf-json=report.json")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, shared_pool: str) -> Path:
    # In the suite's shared ranks; the regressed session in ranks of its own, which read
    # VERDICT_REGRESSED from their environment.
    path = tmp_path_factory.mktemp("matrix")
    shutil.copy(MODELS, path / "verdict_models.py")
    (path / "test_matrix.py").write_text(SUITE)
    session = run_session(path, *RANKS, "--distperf-update-baselines", pool=shared_pool)
    assert session.result.ret == 0, session.output()
    return path


@pytest.fixture(scope="module")
def regressed(recorded: Path) -> Session:
    return run_session(recorded, *RANKS, env={"VERDICT_REGRESSED": "1"})


@pytest.mark.slow
@pytest.mark.parametrize(
    ("test", "failed", "words"),
    [
        ("test_waits", "baseline", "throughput regression"),
        ("test_slow_rank", "baseline", "throughput regression"),
        ("test_host_sync", "baseline", "throughput regression"),
        ("test_computes", "work", "FLOPs per token"),
        ("test_collective", "work", "all_reduce per token: 0 -> 6 calls"),
    ],
)
def test_each_regression_fails_and_none_is_a_busy_machine(
    regressed: Session, test: str, failed: str, words: str
) -> None:
    row = regressed.rows()[f"{test}[auto-2cpu]"]
    assert row[f"{failed}_status"] == "fail", row[f"{failed}_message"]
    assert words in row[f"{failed}_message"]
    assert "machine busy" not in row["verdict"] and row["baseline_verdict"] != "machine busy"
    if failed == "baseline":  # a gross drop, and what was measured outside said so
        assert row["change"] < -0.5 and "measured outside the rank" in row["baseline_message"]
    evidence = row["busy_evidence"]
    assert set(evidence) >= {"run_queue_wait_per_token_s", "steal_per_token_s", "core_slowdown"}
    assert set(row["phase_s"]) >= {"join", "build", "warmup", "timed", "bare", "count", "result"}
    assert regressed.left_behind == ()
