"""Bring your own model: shapes, the rank-side adapter, marker validation, a user's loop.

In-process and quick; the runs on real ranks are in test_litgpt.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from distperf_model.config import PRESETS, Config
from distperf_model.generate import generate, make_prompt
from distperf_model.model import build_model
from torch import nn

from pytest_distperf.judge import gate
from pytest_distperf.measured import Implementation, RankResult, RunResult, Sample
from pytest_distperf.models import context_limit, litgpt_shape, run_shape, shape_of
from pytest_distperf.options import SettingError, workload_from_marker
from pytest_distperf.perfmodel import Calibration, CollectiveFigure
from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.ranks.models import adapt, build, init_from_seed, measure_shape
from pytest_distperf.ranks.timing import (
    Fences,
    reference_token_time,
    step_seconds,
    timed_generation,
)
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.strategies import message_sizes_for

CPU = torch.device("cpu")
NO_LITGPT = "LitGPT is an optional extra: pip install 'pytest-distperf[litgpt]'"


class Layer(nn.Linear):
    pass


class OtherCacheLM(nn.Module):
    """GPT-like, but its cache methods have other names and it declares no block class."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.layers = nn.ModuleList(Layer(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 32)

    def allocate_cache(self, batch: int, length: int) -> None: ...

    def drop_cache(self) -> None: ...

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shape_of_a_preset_has_the_config_counts(name: str) -> None:
    config = Config.from_name(name)
    shape = ModelShape.from_config(config)
    for attribute in ("n_layer", "n_embd", "n_head", "n_query_groups", "head_size", "block_size"):
        assert getattr(shape, attribute) == getattr(config, attribute)
    assert shape.block_param_count() == config.block_param_count()
    assert shape.non_block_param_count() == config.non_block_param_count()
    # a Config is a shape as it is: the cost functions read the same figures from both
    assert message_sizes_for(shape, "fsdp", 2, 2) == message_sizes_for(config, "fsdp", 2, 2)


def test_measured_shape_of_the_reference_model_matches_its_config() -> None:
    model = build_model(Config.from_name("tiny"), seed=1)
    built = adapt(model, "tiny")
    assert built.shape == ModelShape.from_config(model.config)
    assert built.units == (type(model.transformer.h[0]),)


def test_shape_rejects_nonsense() -> None:
    shape = shape_of("tiny")
    assert shape is not None
    with pytest.raises(ValueError, match="n_layer=0"):
        dataclasses.replace(shape, n_layer=0)


def test_builder_shape_is_unknown_before_its_build_then_the_ranks_tell() -> None:
    assert shape_of("package.module:build") is None
    assert context_limit("package.module:build") is None
    assert context_limit("tiny") == 256
    result = _result(Workload(model="package.module:build"))
    assert run_shape(result) is None
    measured = shape_of("pythia-14m")
    rank = dataclasses.replace(result.ranks[0], model_shape=measured)
    assert run_shape(dataclasses.replace(result, ranks=(rank,))) == measured


# --------------------------------------------------------------------------- the adapter


def test_custom_module_without_a_known_cache_interface_gets_the_clear_error() -> None:
    with pytest.raises(TypeError) as error:
        adapt(OtherCacheLM(), "mine:other_cache_lm")
    message = str(error.value)
    assert "distperf(model='mine:other_cache_lm') built OtherCacheLM" in message
    assert "setup_caches(max_batch_size, max_seq_length, device=, dtype=) and clear_caches()" in (
        message
    )
    assert "set_kv_cache(batch_size, max_seq_length, device=, dtype=) and clear_kv_cache()" in (
        message
    )
    assert "it has allocate_cache, drop_cache" in message
    assert "Adding a model" in message


def test_shard_unit_is_found_in_the_largest_module_list_unless_named() -> None:
    class Cached(OtherCacheLM):
        def setup_caches(self, max_batch_size: int, max_seq_length: int, **kw: object) -> None: ...

        def clear_caches(self) -> None: ...

    assert adapt(Cached(), "m:f").units == (Layer,)
    named = adapt(Cached(), "m:f", shard_unit="torch.nn:Embedding")
    assert named.units == (nn.Embedding,)
    with pytest.raises(TypeError, match="is not an nn.Module class"):
        adapt(Cached(), "m:f", shard_unit="math:pi")


def test_a_module_without_blocks_or_positions_is_told_what_is_missing() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(8, 4)

        def setup_caches(self, **kwargs: object) -> None: ...

        def clear_caches(self) -> None: ...

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.embed(idx)

    with pytest.raises(TypeError) as error:
        adapt(Flat(), "m:flat")
    assert "forward(idx, input_pos)" in str(error.value)
    assert "set `block_class` on the model or name it in the marker" in str(error.value)


def test_init_from_seed_depends_on_seed_and_names_only() -> None:
    a, b = OtherCacheLM(), OtherCacheLM()
    init_from_seed(a, 3)
    init_from_seed(b, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    init_from_seed(b, 4)
    assert not torch.equal(a.head.weight, b.head.weight)
    assert torch.all(a.head.bias == 0)


# --------------------------------------------------------------------------- LitGPT


@pytest.fixture
def litgpt() -> None:
    pytest.importorskip("litgpt", reason=NO_LITGPT)


@pytest.mark.usefixtures("litgpt")
def test_litgpt_shape_from_its_config_matches_the_same_preset() -> None:
    # pythia-14m is both a preset (LitGPT's hyperparameters, this project's code) and a LitGPT
    # config: counting LitGPT's config must give the preset's formula.
    assert shape_of("litgpt:pythia-14m") == shape_of("pythia-14m")
    assert context_limit("litgpt:Llama-2-7b-hf") == 4096
    shape = shape_of("litgpt:Llama-2-7b-hf")
    assert shape is not None and shape.n_layer == 32
    assert shape.n_layer * shape.block_params + shape.non_block_params == 6_738_415_616


@pytest.mark.usefixtures("litgpt")
def test_a_litgpt_model_with_buffers_of_its_own_is_built_for_real(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Built on meta, a buffer beside the rope tables would hold whatever memory it got."""
    import litgpt.model

    from pytest_distperf.ranks.models import build_litgpt

    class WithState(litgpt.model.GPT):
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.register_buffer("state", torch.arange(4.0), persistent=False)

    monkeypatch.setattr(litgpt.model, "GPT", WithState)
    module = build_litgpt("pythia-14m", 0, torch.device("cpu"), torch.float32)
    assert torch.equal(module.state, torch.arange(4.0))
    again = build_litgpt("pythia-14m", 0, torch.device("cpu"), torch.float32)
    assert all(
        torch.equal(a, b) for a, b in zip(module.parameters(), again.parameters(), strict=True)
    )


# One of each thing the count must know: GQA and LLaMA's MLP, RMSNorm with qk norms, OLMo's
# LayerNorm without parameters, OLMo-2's wide qk norms, Gemma-2's extra norms, a mixture of
# experts; "deepseek-like" (built below) has latent attention, a grouped router, shared experts
# and dense first layers, which no config of the LitGPT installed here has.
LITGPT_KINDS = (
    "Llama-2-7b-hf",
    "Qwen3-0.6B",
    "OLMo-1B-hf",
    "OLMo-2-1124-7B",
    "Gemma-2-2b",
    "Mixtral-8x7B-v0.1",
    "deepseek-like",
)


def _litgpt_config(name: str) -> Any:
    from litgpt.config import Config as LitConfig

    if name != "deepseek-like":
        return LitConfig.from_name(name)
    latent = dict(
        q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16
    )
    return LitConfig(
        name=name,
        n_layer=3,
        n_embd=64,
        n_head=4,
        vocab_size=100,
        padding_multiple=64,
        norm_class_name="RMSNorm",
        bias=False,
        mlp_class_name="LLaMAMoE",
        intermediate_size=96,
        moe_intermediate_size=32,
        n_expert=4,
        n_expert_per_token=2,
        n_expert_groups=2,
        n_topk_groups=1,
        n_topk_scores_per_group=2,
        n_shared_expert=1,
        first_k_dense_replace=1,
        latent_attention=latent,
    )


@pytest.mark.usefixtures("litgpt")
@pytest.mark.parametrize("name", LITGPT_KINDS)
def test_litgpt_shape_from_its_config_is_what_the_ranks_measure(name: str) -> None:
    """The pytest process counts a LitGPT model from its config (no torch there); a rank
    measures the built model: the two must agree."""
    from litgpt.model import GPT

    config = _litgpt_config(name)
    with torch.device("meta"):
        module = GPT(config)
    assert litgpt_shape(config) == adapt(module, name).shape


@pytest.mark.usefixtures("litgpt")
def test_litgpt_model_is_the_same_in_every_build_and_survives_cache_round_trips() -> None:
    workload = Workload(model="litgpt:pythia-14m", prompt_length=5, max_new_tokens=6)
    first, second = build(workload, CPU, torch.float32), build(workload, CPU, torch.float32)
    prompt = make_prompt(first.shape, 2, 5, seed=1)
    tokens = []
    for built in (first, second, first):
        built.setup_caches(2, 11, CPU, torch.float32)
        tokens.append(generate(built.module, prompt, 6))
        built.clear_caches()
        # dropped before a wrapper sees them: DDP broadcasts the buffers it finds
        assert [name for name, _ in built.module.named_buffers()] == []
    assert torch.equal(tokens[0], tokens[1]) and torch.equal(tokens[0], tokens[2])


@pytest.mark.usefixtures("litgpt")
def test_a_plain_litgpt_gpt_is_adapted_as_it_is() -> None:
    from litgpt.config import Config as LitConfig
    from litgpt.model import GPT, Block

    built = adapt(GPT(LitConfig.from_name("pythia-14m")), "mine:pythia")
    assert built.units == (Block,)
    assert built.shape == shape_of("pythia-14m")
    with pytest.raises(ValueError, match="block size is only 512"):
        built.setup_caches(1, 600, CPU, torch.float32)
    with pytest.raises(ValueError, match="accepts 512"):
        built.check_fits(600, "distperf(...)")


@pytest.mark.usefixtures("litgpt")
def test_session_calibrates_the_message_sizes_of_litgpt_models() -> None:
    workload = Workload(model="litgpt:pythia-14m")
    sizes = gate.session_message_sizes([("fsdp", workload)], 2)
    shape = shape_of("pythia-14m")
    assert sizes is not None and shape is not None
    assert shape.block_params * 4 in sizes.all_gather
    assert shape.non_block_params * 4 in sizes.all_gather


def test_a_missing_litgpt_fails_collection_naming_the_extra(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("import sys\nsys.modules['litgpt'] = None  # as if not installed\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.distperf(model="litgpt:pythia-14m")
        def test_x(distperf):
            pass
        """
    )
    result = pytester.runpytest_subprocess("--distperf-accelerator=cpu")
    result.stdout.fnmatch_lines(["*litgpt:pythia-14m*pip install 'pytest-distperf[[]litgpt[]]'"])
    assert result.ret != 0


# --------------------------------------------------------------------------- markers


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"model": "litgpt:"}, "is not a known model"),
        ({"model": "tiny", "generate": "no_colon"}, "generate='no_colon') must be"),
        ({"model": "tiny", "shard_unit": 3}, "shard_unit=3) must be 'package.module:Class'"),
    ],
)
def test_bad_model_arguments_name_the_value(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(SettingError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        workload_from_marker(kwargs, "t.py::t", tuple(PRESETS))


def test_model_arguments_are_accepted_and_keep_old_identities() -> None:
    workload = workload_from_marker(
        {"model": "litgpt:pythia-14m", "generate": "pkg.loops:mine"}, "t", tuple(PRESETS)
    )
    assert (workload.model_source, workload.is_custom_builder) == ("litgpt", False)
    assert Workload(model="pkg.mod:build").model_source == "builder"
    plain = _result(Workload(model="tiny"))
    # an argument left unset is no part of the identity: baselines recorded before it existed
    # still match
    identity = gate.test_identity(plain)
    assert "generate" not in identity and "shard_unit" not in identity
    assert "generate=pkg.loops:mine" in gate.test_identity(_result(workload))


# --------------------------------------------------------------------------- a user's loop


def _result(
    workload: Workload, samples: tuple[Sample, ...] = (Sample(1.0, None, None),)
) -> RunResult:
    spec = RunSpec("t.py::t", "auto", 1, "cpu", workload, repeats=len(samples), warmup=0, timeout=1)
    rank = RankResult(
        rank=0,
        samples=samples,
        peak_memory_bytes=1,
        memory_kind="x",
        implementation=Implementation("", "", "", ""),
        versions={},
        device_name="cpu",
        tokens=(),
        replicas=1,
        timed_from=0.0,
    )
    return RunResult(spec, (rank,), launch_s=1.0, launched_at=0.0)


def _greedy_loop(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    return generate(model, prompt, max_new_tokens)  # prompt and new tokens


def test_a_users_loop_is_timed_without_a_prefill_split() -> None:
    model = build_model(Config.from_name("tiny"), seed=1)
    model.setup_caches(1, 20)
    prompt = make_prompt(model.config, 1, 4, seed=1)
    local = Fences(sync=lambda: None, barrier=lambda: None)
    builtin, tokens = timed_generation(model, prompt, 6, local)
    own, own_tokens = timed_generation(model, prompt, 6, local, generate=_greedy_loop)
    assert torch.equal(tokens, own_tokens) and tokens.shape == (1, 6)
    assert builtin.ttft_s is not None and own.ttft_s is None and own.decode_s is None
    assert step_seconds(own, 6) == own.total_s / 6
    result = _result(Workload(model="tiny", max_new_tokens=6), (own, own))
    assert result.ttft_s is None and result.decode_tokens_per_sec is None
    assert result.tokens_per_sec == pytest.approx(6 / own.total_s)


def test_the_reference_times_its_prefill_too_unless_the_loop_is_a_users() -> None:
    # A sharded run without a whole copy beside it takes its prefill from here.
    model = build_model(Config.from_name("tiny"), seed=1)
    model.setup_caches(1, 20)
    prompt = make_prompt(model.config, 1, 4, seed=1)
    step_s, prefill_s = reference_token_time(model, prompt, 4, lambda: None)
    assert step_s > 0 and prefill_s is not None and prefill_s > 0
    assert reference_token_time(model, prompt, 4, lambda: None, _greedy_loop)[1] is None


def test_a_compiled_run_with_the_eager_reference_says_so(tmp_path) -> None:
    from pytest_distperf.store.store import BaselineStore
    from pytest_distperf.topology import probe

    judge = gate.Gate(probe("cpu", 2), BaselineStore(tmp_path))
    result = _result(Workload(model="tiny", max_new_tokens=6))
    eager = dataclasses.replace(result.ranks[0], reference_token_s=0.01, eager_reference=True)
    for rank, said in ((dataclasses.replace(eager, eager_reference=False), False), (eager, True)):
        prediction, _ = judge.prediction(dataclasses.replace(result, ranks=(rank,)), None)
        assert prediction is not None and prediction.terms["compute"] == 0.01
        assert any("the eager model's step" in a for a in prediction.assumptions) == said


def test_a_users_loop_returning_too_few_tokens_is_named() -> None:
    model = build_model(Config.from_name("tiny"), seed=1)
    model.setup_caches(1, 20)
    prompt = make_prompt(model.config, 1, 4, seed=1)
    local = Fences(sync=lambda: None, barrier=lambda: None)
    with pytest.raises(ValueError, match=r"shape \(1, 3\); expected \[1, 6\]"):
        timed_generation(model, prompt, 6, local, generate=lambda m, p, n: p[:, :3])


# --------------------------------------------------------------------------- calibration


def test_a_builders_calibration_adds_its_sizes_and_keeps_the_device_figures() -> None:
    def calibration(sizes: tuple[int, ...], bandwidth: float) -> Calibration:
        figures = tuple(CollectiveFigure.from_time("all_gather", s, s / 1e9, 2) for s in sizes)
        return Calibration(2, "gloo", "cpu", figures, (), bandwidth, 1e-5)

    merged = calibration((10, 1000), 5.0).merged(calibration((1000, 500), 7.0))
    assert [f.bytes for f in merged.all_gather] == [10, 500, 1000]
    assert merged.memory_bandwidth == 5.0


def test_measure_shape_without_a_config_falls_back_to_the_embedding() -> None:
    shape = measure_shape(OtherCacheLM(), (Layer,))
    assert (shape.n_layer, shape.n_embd, shape.vocab_size, shape.block_size) == (2, 16, 32, 0)
    total = sum(p.numel() for p in OtherCacheLM().parameters())
    assert shape.n_layer * shape.block_params + shape.non_block_params == total
