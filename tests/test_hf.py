"""Hugging Face `transformers` models as they are, on real CPU ranks (gloo): `hf:<config>` and a
user's builder, under every strategy and gate.

The tokens: a tiny Llama under all seven strategies and a tiny GPT-NeoX under one of each family,
in the suite's shared ranks, each equal to the model's own greedy `generate` in this process.
The gates: one session (in the same ranks) records baselines at the default thresholds for a
config (all seven strategies), a builder, a user's loop over the model's own `generate`, and
training with the model's own loss, then judges one run against its baseline; a model without
a tensor-parallel plan fails its setup saying what to pass. Needs the hf extra.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import hf_models
import pytest
from helpers import Session, run_session, threshold_expected, write_files
from hf_models import FAMILIES, own_generate_tokens, write_config
from shared_pool import SharedPools

from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.strategies import strategy_names

pytestmark = pytest.mark.slow  # every test here runs ranks

pytest.importorskip("transformers", reason="transformers is an optional extra: [hf]")

SEED, BATCH, PROMPT, NEW = 7, 2, 5, 6


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """`hf:<absolute folder>` of each family's tiny config."""
    root = tmp_path_factory.mktemp("hf-configs")
    return {family: f"hf:{write_config(root / family, family)}" for family in FAMILIES}


@pytest.fixture(scope="module")
def own_tokens(configs: dict[str, str]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Each family's new tokens from its own `generate` (greedy, static cache), one process."""
    return {
        family: own_generate_tokens(model, SEED, BATCH, PROMPT, NEW)
        for family, model in configs.items()
    }


def _spec(model: str, strategy: str) -> RunSpec:
    workload = Workload(
        model=model, max_new_tokens=NEW, prompt_length=PROMPT, batch_size=BATCH, seed=SEED
    )
    return RunSpec(
        test_id=f"hf-correctness-{strategy}",
        strategy=strategy,
        devices=2,
        accelerator="cpu",
        workload=workload,
        repeats=1,
        warmup=1,  # the tokens come from a second generation through the same cache
        timeout=120,
        reference_steps=0,  # only the tokens matter here
        count_work=False,
    )


# Llama under every strategy; GPT-NeoX where its other names and fused projection matter.
CASES = [("llama", strategy) for strategy in strategy_names()] + [
    ("gpt_neox", strategy) for strategy in ("auto", "fsdp", "tp", "pipeline")
]


@pytest.mark.parametrize(("family", "strategy"), CASES)
def test_hf_model_generates_its_own_generate_tokens_under_every_strategy(
    family: str,
    strategy: str,
    configs: dict[str, str],
    own_tokens: dict[str, tuple[tuple[int, ...], ...]],
    shared_pool: str,
) -> None:
    expected = own_tokens[family]
    assert len(set(expected)) == BATCH  # the rows differ: batching is exercised
    result = SharedPools(shared_pool).run(_spec(configs[family], strategy))
    for rank in result.ranks:
        assert rank.tokens == expected, f"rank {rank.rank} of {family} under {strategy}"
        assert rank.versions["transformers"]
    assert result.ranks[0].implementation.wrapper != "LlamaForCausalLM"  # the adapter ran


# --------------------------------------------------------------------------- every gate

# Its own module name: the shared ranks keep a module once imported (LitGPT's are `builders`).
BUILDERS = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
)


def llama(seed, device, dtype):
    # A team's own model as they build it: transformers' initialisation from the seed.
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**SIZES))
    return model.to(dtype).eval()


def no_plan(seed, device, dtype):
    model = llama(seed, device, dtype)
    model.config.base_model_tp_plan = None
    return model


def hf_generate(model, prompt, max_new_tokens):
    # The model's own generate, greedy: needs nothing of the plugin's cache interface.
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return out[:, prompt.shape[1]:]
"""

SUITE = """
import pytest

ALL = ("auto", "ddp", "fsdp", "fsdp2", "fsdp-noreshard", "tp", "pipeline")


# The config beside this file, found from the test's folder.
@pytest.mark.strategy(*ALL)
@pytest.mark.distperf(model="hf:llama", max_new_tokens=4, batch_size=2)
def test_config(distperf):
    distperf.run()


@pytest.mark.strategy("fsdp")
@pytest.mark.distperf(model="hf_builders:llama", max_new_tokens=4, batch_size=2)
def test_builder(distperf):
    distperf.run()


# Gates off: a user's own loop is predicted from the built-in loop's reference (issue 24). Under
# auto (DDP) its call of the model's `generate` goes through DDP's forward.
@pytest.mark.strategy("auto")
@pytest.mark.distperf(
    model="hf_builders:llama", max_new_tokens=4, generate="hf_builders:hf_generate", gates=False
)
def test_own_generate(distperf):
    distperf.run()


@pytest.mark.strategy("fsdp", "tp")
@pytest.mark.distperf(model="hf:llama", mode="train", seq_length=16, batch_size=2)
def test_train(distperf):
    distperf.run()
"""

BAD = """
import pytest


@pytest.mark.strategy("tp")
@pytest.mark.distperf(model="hf_builders:no_plan", max_new_tokens=4)
def test_no_plan(distperf):
    distperf.run()
"""


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory, shared_pool: str) -> dict[str, Session]:
    """Every HF test recorded as a baseline at the default thresholds, in the shared ranks; then
    two of them again, judged against those baselines."""
    path = tmp_path_factory.mktemp("hf-gates")
    write_files(path, hf_builders=BUILDERS, test_suite=SUITE, test_bad=BAD)
    write_config(path / "llama", "llama")
    common = ("--distperf-devices=2", "--distperf-accelerator=cpu", "--distperf-repeats=3")
    again = ("test_suite.py::test_config[auto-2cpu]",)
    return {
        "recorded": run_session(
            path,
            *common,
            *("--distperf-update-baselines", "--distperf-json=report.json"),
            pool=shared_pool,
        ),
        "again": run_session(path, *common, "--distperf-json=again.json", *again, pool=shared_pool),
    }


@pytest.fixture(scope="module")
def gated(sessions: dict[str, Session]) -> Session:
    return sessions["recorded"]


def test_hf_models_pass_every_gate(gated: Session) -> None:
    output = gated.output()
    gated.assert_outcomes(passed=7 + 1 + 1 + 2, failed=1)
    rows = gated.rows()
    for test_id, row in rows.items():
        # every run predicted from the built model's own shape, judged and recorded
        assert row["prediction"] is not None, test_id
        assert row["baseline_recorded"], test_id
        assert row["versions"]["transformers"], test_id
        source = "hf" if test_id.startswith(("test_config", "test_train")) else "builder"
        assert row["model_source"] == source, test_id
        if not test_id.startswith("test_own_generate"):
            assert row["threshold_status"] == threshold_expected(row), (test_id, row)
    for test_id in ("test_config[fsdp-2cpu]", "test_builder[fsdp-2cpu]"):
        assert rows[test_id]["work"]["decode"]["collectives"]["all_gather"]["calls"] > 0
    for strategy in ("fsdp", "tp"):
        row = rows[f"test_train[{strategy}-2cpu]"]
        assert row["loss"] == pytest.approx(row["reference_loss"], rel=1e-4), strategy
    startup = rows["test_config[auto-2cpu]"]["phase_s"]
    assert {"model_import", "model_build"} <= set(startup)
    # the model without a plan: a setup error that says what to pass
    assert "has no base_model_tp_plan" in output and "tp_plan=" in output
    assert json.loads((gated.path / "report.json").read_text())["results"]


def test_hf_runs_are_judged_against_their_baselines(sessions: dict[str, Session]) -> None:
    rows = sessions["again"].rows("again.json")
    assert set(rows) == {"test_config[auto-2cpu]"}
    for test_id, row in rows.items():
        # compared with the recorded runs (whatever the verdict on this shared machine)
        assert row["baseline_tokens_per_sec"] is not None, (test_id, row["baseline_message"])
        assert row["memory_status"] not in (None, "skipped"), (test_id, row["memory_message"])


def test_hf_config_relative_to_the_test_file(gated: Session) -> None:
    # `hf:llama` was written relative to the suite's folder, which is the session's too: a
    # session started elsewhere finds it the same way (the test's folder, not the cwd).
    assert Path(gated.path / "llama" / "config.json").is_file()
    assert "test_config[pipeline-2cpu]" in gated.rows()


# --------------------------------------------------------------------------- in this process


def _tiny_llama(**changes: object) -> object:
    import torch
    import transformers

    sizes = {**hf_models.TINY, **hf_models.FAMILIES["llama"], **changes}
    torch.manual_seed(SEED)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes)).eval()


def test_a_builders_hf_model_is_adapted_its_layers_and_sizes_found() -> None:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP

    from pytest_distperf.ranks.hf import HFCausalLM, is_hf_causal_lm
    from pytest_distperf.ranks.models import adapt

    model = _tiny_llama()
    assert is_hf_causal_lm(model) and not is_hf_causal_lm(model.model)  # no head: not an LM
    built = adapt(model, "hf_builders:llama")
    assert isinstance(built.module, HFCausalLM) and built.units == (LlamaDecoderLayer,)
    assert (built.shape.n_layer, built.shape.n_query_groups, built.shape.block_size) == (4, 2, 64)
    assert built.transformers_version and built.forward_methods == ()
    mlp = "transformers.models.llama.modeling_llama:LlamaMLP"
    assert adapt(_tiny_llama(), "m", shard_unit=mlp).units == (LlamaMLP,)  # the marker's wins
    own = adapt(_tiny_llama(), "m", own_loop=True)  # the test's own loop: the model as it is
    assert type(own.module).__name__ == "LlamaForCausalLM"
    assert own.forward_methods == ("generate",) and own.units == (LlamaDecoderLayer,)


def test_placement_errors_say_why_and_what_to_pass() -> None:
    import torch

    from pytest_distperf.ranks.hf import HFCausalLM

    model = _tiny_llama()
    model.config.base_model_tp_plan = None
    with pytest.raises(ValueError, match=r"no base_model_tp_plan.*tp_plan='package.module"):
        HFCausalLM(model, "hf_builders:no_plan").tp_plan()
    adapter = HFCausalLM(_tiny_llama(), "m")
    assert adapter.tp_plan()["model.model.layers.*.self_attn.o_proj"] == "rowwise"
    # where tp sums over the ranks: each layer's row-wise o_proj and down_proj, timed in-step
    from pytest_distperf.ranks.strategies.tp import collective_points

    layers = adapter.model.model.layers
    expected = [
        linear for layer in layers for linear in (layer.self_attn.o_proj, layer.mlp.down_proj)
    ]
    assert collective_points(adapter) == expected
    parts = adapter.pipeline_parts()
    assert [attribute for _, attribute in parts] == ["embed_tokens", "layers", "norm", "lm_head"]
    adapter.model.get_input_embeddings = lambda: torch.nn.Embedding(2, 2)  # not a direct part
    with pytest.raises(TypeError, match="no embedding found .* cannot be cut by layers"):
        adapter.pipeline_parts()


@pytest.mark.gpu
@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs a CUDA device (gpu marker)"
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_hf_model_on_one_gpu_generates_its_own_generate_tokens(
    compiled: bool, configs: dict[str, str]
) -> None:
    """On a GPU the static cache's positions move on the device (and, compiled, as graphs):
    the tokens must still be the model's own `generate`'s."""
    from pytest_distperf.launch.pool import Pools

    model = configs["llama"]
    expected = own_generate_tokens(model, SEED, BATCH, PROMPT, NEW, device="cuda")
    pools = Pools()
    try:
        for strategy in ("auto", "fsdp"):
            spec = dataclasses.replace(
                _spec(model, strategy), accelerator="cuda", devices=1, compile=compiled
            )
            result = pools.run(spec)
            assert result.ranks[0].tokens == expected, strategy
    finally:
        pools.close()
