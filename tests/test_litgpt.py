"""Bring your own model, on real CPU ranks (gloo): LitGPT by name and by a plain builder.

Every gate must work for them as for the reference model: thresholds from their own shapes,
baselines recorded and compared, the same tokens under every strategy, and a model that got
slower by itself failing against its baseline. Needs the litgpt extra.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from distperf_model.generate import generate, make_prompt

from pytest_distperf.launch.pool import Pools
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.strategies import STRATEGIES

pytestmark = pytest.mark.slow

NO_LITGPT = "LitGPT is an optional extra: pip install 'pytest-distperf[litgpt]'"
# The families that run any GPT-like model as it is; tp and pipeline split only models whose
# modules they know (LitGPT's and the reference GPT's) or a marker's tp_plan.
ANY_MODEL_STRATEGIES = [r.name for r in STRATEGIES.values() if r.family in ("replicated", "fsdp")]

BUILDERS = '''
import os
import time

import torch
from litgpt.config import Config
from litgpt.model import GPT
from torch import nn


def pythia(seed, device, dtype):
    """LitGPT's GPT as it is, with LitGPT's own initialisation from the seed."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(Config.from_name("pythia-14m"))
    delay = float(os.environ.get("DISTPERF_TEST_ATTENTION_SLEEP", "0"))
    if delay:  # a model that got slower by itself: every attention call sleeps first
        for block in model.transformer.h:
            block.attn.forward = _sleeping(block.attn.forward, delay)
    return model.to(dtype)


def _sleeping(forward, delay):
    def slowed(*args, **kwargs):
        time.sleep(delay)
        return forward(*args, **kwargs)

    return slowed


def greedy(model, prompt, max_new_tokens):
    """A user's own loop: LitGPT's forward with its KV cache, greedy; new tokens only."""
    length, device = prompt.shape[1], prompt.device
    token = model(prompt, torch.arange(length, device=device))[:, -1].argmax(-1, keepdim=True)
    tokens, position = [token], torch.tensor([length], device=device)
    for _ in range(max_new_tokens - 1):
        token = model(token, position)[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
        position = position + 1
    return torch.cat(tokens, dim=1)


class OtherCache(nn.Module):
    """GPT-like, but its KV cache methods have names distperf does not know."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(64, 16)
        self.h = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.lm_head = nn.Linear(16, 64)

    def init_kv_cache(self, batch_size, length):
        pass

    def reset_kv_cache(self):
        pass

    def forward(self, idx, input_pos=None):
        x = self.wte(idx)
        for layer in self.h:
            x = layer(x)
        return self.lm_head(x)


def other_cache(seed, device, dtype):
    return OtherCache().to(device=device, dtype=dtype)
'''

SUITE = """
import json
from pathlib import Path

import pytest


def keep(result, name):
    Path("tokens").mkdir(exist_ok=True)
    Path("tokens", f"{name}-{result.strategy}.json").write_text(json.dumps(result.tokens))


# 4 tokens: on gloo, fsdp gathers the whole model over loopback for every one of them
@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
@pytest.mark.distperf(model="litgpt:pythia-14m", max_new_tokens=4, batch_size=2)
def test_by_name(distperf):
    keep(distperf.run(), "name")


@pytest.mark.strategy("auto", "fsdp", "fsdp-noreshard")
@pytest.mark.distperf(model="builders:pythia", max_new_tokens=4, batch_size=2)
def test_builder(distperf):
    keep(distperf.run(), "builder")


@pytest.mark.distperf(
    model="builders:pythia", max_new_tokens=4, batch_size=2, generate="builders:greedy"
)
def test_own_loop(distperf):
    keep(distperf.run(), "own-loop")
"""

BAD = """
import pytest


@pytest.mark.distperf(model="builders:other_cache", max_new_tokens=4)
def test_other_cache(distperf):
    distperf.run()
"""


@pytest.fixture
def litgpt() -> None:
    pytest.importorskip("litgpt", reason=NO_LITGPT)


@pytest.mark.usefixtures("litgpt")
def test_litgpt_models_pass_every_gate_and_a_slower_one_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(builders=BUILDERS, test_suite=SUITE, test_bad=BAD)
    report = pytester.path / "report.json"
    common = ("--distperf-devices=2", "--distperf-accelerator=cpu", f"--distperf-json={report}")
    # Two shared cores: healthy runs of these models measured 0.51-1.1 of their prediction, so
    # a looser efficiency than the default keeps a busy CI host from failing the threshold.
    recorded = pytester.runpytest_subprocess(
        *common, "--distperf-update-baselines", "--distperf-efficiency=0.2", "test_suite.py"
    )
    recorded.assert_outcomes(passed=7)
    rows = {row["test_id"].split("::")[1]: row for row in json.loads(report.read_text())["results"]}
    for test_id, row in rows.items():
        # every run was predicted from its own model's shape (the builder's measured in its
        # ranks), met its threshold and became a baseline
        assert row["prediction"] is not None, test_id
        assert row["threshold_status"] == "ok", (test_id, row["threshold_message"])
        assert row["baseline_recorded"], test_id
    assert rows["test_own_loop[auto-2cpu]"]["ttft_s"] is None  # a user's loop has no split
    assert rows["test_own_loop[auto-2cpu]"]["decode_tokens_per_sec"] is None
    for name in ("name", "builder"):
        tokens = {
            path.name: json.loads(path.read_text())
            for path in (pytester.path / "tokens").glob(f"{name}-*.json")
        }
        assert len(tokens) == 3 and len(set(map(str, tokens.values()))) == 1, tokens
    own = json.loads((pytester.path / "tokens" / "own-loop-auto.json").read_text())
    builder = json.loads((pytester.path / "tokens" / "builder-auto.json").read_text())
    assert own == builder  # the user's greedy loop makes the built-in loop's tokens

    monkeypatch.setenv("DISTPERF_TEST_ATTENTION_SLEEP", "0.005")
    slowed = pytester.runpytest_subprocess(
        *common, "test_suite.py::test_builder[auto-2cpu]", "test_bad.py"
    )
    slowed.assert_outcomes(failed=2)
    slowed.stdout.fnmatch_lines(
        [
            "*distperf baseline check failed:*",
            "*KV cache methods: either setup_caches(max_batch_size, max_seq_length, device=, "
            "dtype=) and clear_caches()*, or set_kv_cache(*) and clear_kv_cache()*; it has "
            "init_kv_cache, reset_kv_cache*",
        ]
    )
    assert "own model builder" not in recorded.stdout.str() + slowed.stdout.str()


@pytest.fixture(scope="module")
def single_process_tokens() -> list[list[int]]:
    pytest.importorskip("litgpt", reason=NO_LITGPT)
    from pytest_distperf.ranks.models import build

    built = build(WORKLOAD, torch.device("cpu"), torch.float32)
    built.setup_caches(2, WORKLOAD.prompt_length + WORKLOAD.max_new_tokens, "cpu", torch.float32)
    prompt = make_prompt(built.shape, 2, WORKLOAD.prompt_length, WORKLOAD.seed)
    with torch.no_grad():
        out = generate(built.module, prompt, WORKLOAD.max_new_tokens)
    return out[:, WORKLOAD.prompt_length :].tolist()


WORKLOAD = Workload(
    model="litgpt:pythia-14m", max_new_tokens=6, prompt_length=5, batch_size=2, seed=7
)


@pytest.fixture(scope="module")
def pools() -> Iterator[Pools]:
    # One pool for every strategy, as a session runs them.
    pools = Pools()
    yield pools
    pools.close()


# tp and pipeline split LitGPT's GPT by its own module names (no plan given)
MODEL_PARALLEL_SHARDING = {
    "tp": "TP 2-way: 12 column-wise, 12 row-wise linears",
    "pipeline": "pipeline 2 stages of 3+3 blocks (send/recv)",
}


@pytest.mark.parametrize("strategy", [*ANY_MODEL_STRATEGIES, *MODEL_PARALLEL_SHARDING])
def test_litgpt_strategy_generates_the_single_process_tokens(
    strategy: str, single_process_tokens: list[list[int]], pools: Pools
) -> None:
    spec = RunSpec(
        test_id=f"litgpt-correctness-{strategy}",
        strategy=strategy,
        devices=2,
        accelerator="cpu",
        workload=WORKLOAD,
        repeats=1,
        warmup=0,
        timeout=180,
        reference_steps=0,
    )
    result = pools.run(spec)
    assert len({tuple(row) for row in single_process_tokens}) == 2  # batching is exercised
    for rank in result.ranks:
        assert [list(row) for row in rank.tokens] == single_process_tokens, rank.rank
    if strategy in MODEL_PARALLEL_SHARDING:
        assert result.implementation.sharding == MODEL_PARALLEL_SHARDING[strategy]
