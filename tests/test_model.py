from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from distperf_model import GPT, PRESETS, CausalSelfAttention, Config, build_model, make_prompt
from distperf_model.generate import decode_one_token, generate, prefill
from torch import nn

TINY = Config.from_name("tiny")
# The llama-style branches (RMSNorm, SwiGLU, GQA, sequential residual, no bias) at tiny size.
TINY_LLAMA = dataclasses.replace(
    TINY,
    name="tiny-llama",
    n_query_groups=2,
    rotary_percentage=1.0,
    parallel_residual=False,
    bias=False,
    norm_class="RMSNorm",
    mlp_class="LLaMAMLP",
    intermediate_size=172,
)


def recompute_generate(model: GPT, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, list]:
    """Greedy decoding without cache: the whole sequence is re-run at every step."""
    seq, last_logits = prompt, []
    with torch.no_grad():
        for _ in range(n):
            logits = model(seq)[:, -1]  # [B, V]
            last_logits.append(logits)
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq, last_logits


@pytest.mark.parametrize("config", [TINY, TINY_LLAMA], ids=lambda c: c.name)
@pytest.mark.parametrize("batch_size", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_cache_matches_recompute(config: Config, batch_size: int, seed: int) -> None:
    model = build_model(config, seed=seed)
    prompt = make_prompt(config, batch_size, prompt_length=7, seed=seed, device="cpu")
    n_new = 12
    expected, ref_logits = recompute_generate(model, prompt, n_new)

    model.setup_caches(batch_size, 7 + n_new)
    assert torch.equal(generate(model, prompt, n_new), expected)

    # logits step by step, through the public prefill/decode pieces, from a fresh cache
    model.setup_caches(batch_size, 7 + n_new)
    with torch.no_grad():
        logits = model(prompt, torch.arange(7))[:, -1]
        torch.testing.assert_close(logits, ref_logits[0], rtol=1e-4, atol=1e-5)
        for step in range(1, n_new):
            pos = 7 + step - 1
            logits = model(expected[:, pos : pos + 1], torch.tensor([pos]))[:, -1]
            torch.testing.assert_close(logits, ref_logits[step], rtol=1e-4, atol=1e-5)


def test_prefill_and_decode_return_next_tokens() -> None:
    model = build_model(TINY, seed=0)
    prompt = make_prompt(TINY, 2, 5, seed=3, device="cpu")
    model.setup_caches(2, 8)
    with torch.no_grad():
        token = prefill(model, prompt, torch.arange(5))
        assert token.shape == (2, 1) and token.dtype == torch.long
        token = decode_one_token(model, token, torch.tensor([5]))
    assert token.shape == (2, 1)


def test_sampling_is_seeded_and_in_range() -> None:
    model = build_model(TINY, seed=0)
    prompt = make_prompt(TINY, 2, 4, seed=0, device="cpu")
    outs = []
    for _ in range(2):
        model.setup_caches(2, 10)
        g = torch.Generator().manual_seed(7)
        outs.append(generate(model, prompt, 6, temperature=1.0, top_k=5, generator=g))
    assert torch.equal(outs[0], outs[1])
    assert outs[0].min() >= 0 and outs[0].max() < TINY.padded_vocab_size


def test_make_prompt_is_deterministic() -> None:
    a = make_prompt(TINY, 3, 9, seed=5, device="cpu")
    assert a.shape == (3, 9) and a.dtype == torch.long
    assert torch.equal(a, make_prompt(TINY, 3, 9, seed=5, device="cpu"))
    assert not torch.equal(a, make_prompt(TINY, 3, 9, seed=6, device="cpu"))
    assert a.min() >= 0 and a.max() < TINY.vocab_size


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_param_count_matches_module(name: str) -> None:
    config = Config.from_name(name)
    with torch.device("meta"):
        model = GPT(config)
    assert config.param_count() == sum(p.numel() for p in model.parameters())
    assert config.block_param_count() == sum(p.numel() for p in model.transformer.h[0].parameters())
    non_block = config.param_count() - config.n_layer * config.block_param_count()
    assert config.non_block_param_count() == non_block


@pytest.mark.parametrize(
    ("name", "total"),
    [("pythia-70m", 70.4e6), ("pythia-2.8b", 2.78e9), ("llama-2-7b", 6.74e9)],
)
def test_well_known_totals(name: str, total: float) -> None:
    assert Config.from_name(name).param_count() == pytest.approx(total, rel=0.01)


def test_litgpt_derived_fields() -> None:
    pythia = Config.from_name("pythia-2.8b")
    assert pythia.padded_vocab_size == 50304 and pythia.head_size == 80
    assert pythia.rope_n_elem == 20
    llama = Config.from_name("llama-2-7b")
    assert llama.padded_vocab_size == 32000 and llama.rope_n_elem == 128


@pytest.mark.parametrize("config", [TINY, TINY_LLAMA], ids=lambda c: c.name)
def test_meta_build_equals_eager_build(config: Config) -> None:
    eager = GPT(config)
    with torch.no_grad():
        eager.init_weights(seed=11)
    meta = build_model(config, seed=11)
    sd_eager, sd_meta = eager.state_dict(), meta.state_dict()
    assert sd_eager.keys() == sd_meta.keys()
    for key in sd_eager:
        assert torch.equal(sd_eager[key], sd_meta[key]), key
    other = build_model(config, seed=12)
    assert not torch.equal(other.lm_head.weight, meta.lm_head.weight)
    # same shape, different names: each parameter has its own stream
    h = meta.transformer.h
    assert not torch.equal(h[0].attn.qkv.weight, h[1].attn.qkv.weight)


def test_init_weights_is_dtype_independent() -> None:
    fp32 = build_model(TINY, seed=3)
    bf16 = build_model(TINY, seed=3, dtype=torch.bfloat16)
    for (key, a), b in zip(fp32.state_dict().items(), bf16.state_dict().values(), strict=True):
        assert torch.equal(a.to(torch.bfloat16), b), key


def test_no_buffers_before_setup_caches_and_none_persisted() -> None:
    model = build_model(TINY, seed=0)
    assert list(model.buffers()) == []
    model.setup_caches(1, 16)
    assert len(list(model.buffers())) == 2 + 2 * TINY.n_layer  # cos, sin, k and v per layer
    assert build_model(TINY, seed=0).state_dict().keys() == model.state_dict().keys()


class _Wrapper(nn.Module):
    """Stands in for an FSDP1 wrapper, which hides the block behind another module."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.module(*args)


def test_setup_caches_finds_wrapped_attention() -> None:
    model = build_model(TINY, seed=0)
    model.transformer.h = nn.ModuleList(_Wrapper(b) for b in model.transformer.h)
    model.setup_caches(2, 16, device=torch.device("cpu"), dtype=torch.float32)
    attns = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    assert len(attns) == TINY.n_layer
    assert all(a.kv_cache is not None for a in attns)
    out = generate(model, make_prompt(TINY, 2, 4, seed=0, device="cpu"), 3)
    assert out.shape == (2, 7)


def test_bf16_runs_with_finite_logits() -> None:
    model = build_model(TINY_LLAMA, seed=0, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    prompt = make_prompt(TINY_LLAMA, 2, 6, seed=0, device="cpu")
    model.setup_caches(2, 10, device=torch.device("cpu"), dtype=torch.bfloat16)
    with torch.no_grad():
        logits = model(prompt, torch.arange(6))
        assert logits.dtype == torch.bfloat16 and logits.shape == (2, 6, 256)
        assert torch.isfinite(logits).all()
        assert torch.isfinite(model(prompt)).all()
    assert generate(model, prompt, 4).shape == (2, 10)


def test_forward_with_input_pos_needs_caches() -> None:
    model = build_model(TINY, seed=0)
    with pytest.raises(RuntimeError, match="setup_caches"):
        model(make_prompt(TINY, 1, 3, seed=0, device="cpu"), torch.arange(3))
    with pytest.raises(ValueError, match="block_size"):
        model.setup_caches(1, TINY.block_size + 1)


def test_from_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="no-such-model") as info:
        Config.from_name("no-such-model")
    for name in PRESETS:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_embd", 66),
        ("n_query_groups", 3),
        ("norm_class", "BatchNorm"),
        ("mlp_class", "MoE"),
        ("padded_vocab_size", 100),
        ("n_layer", 0),
        ("rotary_percentage", 0.0),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field}={value!r}"):
        dataclasses.replace(TINY, **{field: value})


def test_config_imports_without_torch() -> None:
    # the performance model sizes weights from Config and must not pay for a torch import
    code = (
        "import sys, distperf_model\n"
        "assert distperf_model.Config.from_name('tiny').param_count() > 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_package_exports_resolve() -> None:
    import distperf_model

    for name in distperf_model.__all__:
        assert getattr(distperf_model, name) is not None, name
