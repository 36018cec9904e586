"""Every strategy computes the same function: in fp32 its greedy tokens equal one process's.

pythia-14m: a real LitGPT shape (4 heads split by tp, 6 blocks in pipeline stages) that is still
quick on two CPU ranks. The strategies run one after another in one rank pool, as a session runs
them (the pool test_litgpt.py uses too); the elastic launcher (--distperf-fresh-ranks) gets one
run of its own."""

from __future__ import annotations

import signal

import pytest
import torch
from distperf_model.config import Config
from distperf_model.generate import generate, make_prompt
from distperf_model.model import build_model

from pytest_distperf.launch.elastic import launch
from pytest_distperf.launch.pool import Pools
from pytest_distperf.measured import RunResult
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.strategies import strategy_names

pytestmark = pytest.mark.slow

WORKLOAD = Workload(
    model="pythia-14m", max_new_tokens=6, prompt_length=5, batch_size=2, precision="fp32", seed=7
)


@pytest.fixture(scope="module")
def single_process_tokens() -> tuple[tuple[int, ...], ...]:
    config = Config.from_name(WORKLOAD.model)
    model = build_model(config, seed=WORKLOAD.seed)
    model.setup_caches(WORKLOAD.batch_size, WORKLOAD.prompt_length + WORKLOAD.max_new_tokens)
    prompt = make_prompt(config, WORKLOAD.batch_size, WORKLOAD.prompt_length, WORKLOAD.seed)
    with torch.no_grad():
        out = generate(model, prompt, WORKLOAD.max_new_tokens)
    return tuple(tuple(row) for row in out[:, WORKLOAD.prompt_length :].tolist())


def _spec(strategy: str) -> RunSpec:
    return RunSpec(
        test_id=f"correctness-{strategy}",
        strategy=strategy,
        devices=2,
        accelerator="cpu",
        workload=WORKLOAD,
        repeats=1,
        warmup=1,  # the tokens come from a second generation through the same caches
        timeout=120,
        reference_steps=0,  # no reference and no bare copy: only the tokens matter here
        count_work=False,  # nor the work, nor the rank's own decode
    )


def _check_tokens(result: RunResult, expected: tuple[tuple[int, ...], ...]) -> None:
    assert len(set(expected)) == 2  # the two rows differ: batching is exercised
    for rank in result.ranks:
        assert rank.tokens == expected, f"rank {rank.rank} of {result.spec.strategy}"


@pytest.mark.parametrize("strategy", strategy_names())
def test_strategy_generates_the_single_process_tokens(
    strategy: str, single_process_tokens: tuple[tuple[int, ...], ...], cpu_pools: Pools
) -> None:
    _check_tokens(cpu_pools.run(_spec(strategy)), single_process_tokens)


def test_fresh_ranks_generate_them_too_and_give_the_signal_handlers_back(
    single_process_tokens: tuple[tuple[int, ...], ...],
) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    result = launch(_spec("fsdp"))
    # the elastic agent's handlers must not outlive the launch (Ctrl-C between tests)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    _check_tokens(result, single_process_tokens)
