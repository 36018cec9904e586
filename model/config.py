"""Model configuration: one frozen dataclass and the named presets.

Kept free of torch so that the performance model and the plugin can size a model (parameter
count, bytes per block) without paying for a torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

_NORM_CLASSES = ("LayerNorm", "RMSNorm")
_MLP_CLASSES = ("GptNeoxMLP", "LLaMAMLP")


@dataclass(frozen=True)
class Config:
    name: str
    block_size: int  # longest sequence (prompt + generated) the model accepts
    vocab_size: int  # tokens a prompt may contain
    padded_vocab_size: int  # rows of wte / lm_head; padded for GEMM-friendly shapes
    n_layer: int
    n_head: int
    n_embd: int
    n_query_groups: int  # == n_head: MHA, 1: MQA, in between: GQA
    intermediate_size: int
    rotary_percentage: float  # share of each head's dims that rotary embeddings rotate
    parallel_residual: bool  # GPT-NeoX: x + attn(norm_1(x)) + mlp(norm_2(x))
    bias: bool
    norm_class: str  # "LayerNorm" | "RMSNorm"
    norm_eps: float
    mlp_class: str  # "GptNeoxMLP" | "LLaMAMLP"
    rope_base: int

    def __post_init__(self) -> None:
        positive = (
            "block_size",
            "vocab_size",
            "padded_vocab_size",
            "n_layer",
            "n_head",
            "n_embd",
            "n_query_groups",
            "intermediate_size",
            "rope_base",
        )
        for field_name in positive:
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                self._bad(field_name, "must be a positive int")
        if self.padded_vocab_size < self.vocab_size:
            self._bad("padded_vocab_size", f"must be >= vocab_size ({self.vocab_size})")
        if self.n_embd % self.n_head:
            self._bad("n_embd", f"must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_query_groups:
            self._bad("n_query_groups", f"must divide n_head ({self.n_head})")
        if not 0.0 < self.rotary_percentage <= 1.0:
            self._bad("rotary_percentage", "must be in (0, 1]")
        # rotate-half rope pairs dim i with dim i + n/2, so the rotated span must be even
        if self.rope_n_elem < 2 or self.rope_n_elem % 2:
            self._bad(
                "rotary_percentage",
                f"gives rope_n_elem={self.rope_n_elem} of head_size {self.head_size}; "
                "it must be even and >= 2",
            )
        if self.norm_class not in _NORM_CLASSES:
            self._bad("norm_class", f"must be one of {_NORM_CLASSES}")
        if self.mlp_class not in _MLP_CLASSES:
            self._bad("mlp_class", f"must be one of {_MLP_CLASSES}")
        if not self.norm_eps > 0:
            self._bad("norm_eps", "must be > 0")

    def _bad(self, field_name: str, why: str) -> NoReturn:
        value = getattr(self, field_name)
        raise ValueError(f"Config {self.name!r}: {field_name}={value!r} {why}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def rope_n_elem(self) -> int:
        return int(self.rotary_percentage * self.head_size)

    @classmethod
    def from_name(cls, name: str) -> Config:
        try:
            return PRESETS[name]
        except KeyError:
            valid = ", ".join(sorted(PRESETS))
            raise ValueError(f"unknown model config {name!r}; valid names: {valid}") from None

    # The counts mirror model.py layer by layer; tests check them against sum(p.numel()), so the
    # performance model can size weights and all-gathers without building anything.

    def _norm_params(self) -> int:
        # nn.LayerNorm always carries a bias (as in LitGPT), whatever `bias` says
        return 2 * self.n_embd if self.norm_class == "LayerNorm" else self.n_embd

    def block_param_count(self) -> int:
        e, i, hs = self.n_embd, self.intermediate_size, self.head_size
        qkv_out = (self.n_head + 2 * self.n_query_groups) * hs
        attn = e * qkv_out + self.n_head * hs * e
        if self.bias:
            attn += qkv_out + e
        if self.mlp_class == "GptNeoxMLP":
            mlp = 2 * e * i + ((i + e) if self.bias else 0)
        else:
            mlp = 3 * e * i + ((2 * i + e) if self.bias else 0)
        return 2 * self._norm_params() + attn + mlp

    def non_block_param_count(self) -> int:
        # wte + ln_f + lm_head (no bias, untied, as in LitGPT)
        return 2 * self.padded_vocab_size * self.n_embd + self._norm_params()

    def param_count(self) -> int:
        return self.n_layer * self.block_param_count() + self.non_block_param_count()


def _neox(
    name: str, block_size: int, n_layer: int, n_embd: int, n_head: int, vocab_size: int = 50254
) -> Config:
    # Pythia's defaults in LitGPT: padding_multiple=128 (50254 -> 50304), 4x MLP, rope on 25% of
    # each head, parallel residual, LayerNorm eps 1e-5, biases everywhere, MHA.
    padded = -(-vocab_size // 128) * 128
    return Config(
        name=name,
        block_size=block_size,
        vocab_size=vocab_size,
        padded_vocab_size=padded,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_query_groups=n_head,
        intermediate_size=4 * n_embd,
        rotary_percentage=0.25,
        parallel_residual=True,
        bias=True,
        norm_class="LayerNorm",
        norm_eps=1e-5,
        mlp_class="GptNeoxMLP",
        rope_base=10000,
    )


def _llama_shaped(
    name: str,
    *,
    block_size: int,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_query_groups: int,
    width: int,
    vocab_size: int = 256,
) -> Config:
    """A LLaMA-style config: RMSNorm, SwiGLU MLP of `width`, full rotary, no biases."""
    return Config(
        name=name,
        block_size=block_size,
        vocab_size=vocab_size,
        padded_vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        n_query_groups=n_query_groups,
        intermediate_size=width,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class="RMSNorm",
        norm_eps=1e-5,
        mlp_class="LLaMAMLP",
        rope_base=10000,
    )


# Values follow LitGPT's litgpt/config.py (github.com/Lightning-AI/litgpt, the "EleutherAI
# Pythia" and "Meta LLaMA 2" entries plus the Config defaults they inherit: block_size 4096,
# n_layer 16, n_embd 4096, n_head 32, vocab 50254, rope_base 10000), written out in full here.
_PRESET_LIST = (
    _neox("pythia-14m", block_size=512, n_layer=6, n_embd=128, n_head=4),
    _neox("pythia-70m", block_size=2048, n_layer=6, n_embd=512, n_head=8),
    _neox("pythia-160m", block_size=2048, n_layer=12, n_embd=768, n_head=12),
    _neox("pythia-410m", block_size=2048, n_layer=24, n_embd=1024, n_head=16),
    _neox("pythia-1b", block_size=2048, n_layer=16, n_embd=2048, n_head=8),
    _neox("pythia-2.8b", block_size=2048, n_layer=32, n_embd=2560, n_head=32),
    # LitGPT "Llama-2-7b-hf": vocab 32000 is already a multiple of its padding_multiple (64)
    _llama_shaped(
        "llama-2-7b",
        block_size=4096,
        n_layer=32,
        n_embd=4096,
        n_head=32,
        n_query_groups=32,
        width=11008,
        vocab_size=32000,
    ),
    # Not from LitGPT: a two-layer model for fast unit tests.
    Config(
        name="tiny",
        block_size=256,
        vocab_size=256,
        padded_vocab_size=256,
        n_layer=2,
        n_head=4,
        n_embd=64,
        n_query_groups=4,
        intermediate_size=256,
        rotary_percentage=0.25,
        parallel_residual=True,
        bias=True,
        norm_class="LayerNorm",
        norm_eps=1e-5,
        mlp_class="GptNeoxMLP",
        rope_base=10000,
    ),
    # Not from LitGPT: "tiny" shaped as LLaMA (RMSNorm, SwiGLU, no biases) with 2 query groups
    # for 4 heads, for tests of grouped-query attention.
    _llama_shaped(
        "tiny-llama", block_size=64, n_layer=2, n_embd=64, n_head=4, n_query_groups=2, width=128
    ),
    # Not from LitGPT: about 118M parameters in 8 wide blocks, so that on CPU/gloo the per-block
    # all-gathers of FSDP outweigh the matmuls and the slowdown the plugin must catch shows up.
    _neox("cpu-110m", block_size=512, n_layer=8, n_embd=1024, n_head=16, vocab_size=8192),
)

PRESETS: dict[str, Config] = {c.name: c for c in _PRESET_LIST}
