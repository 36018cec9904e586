"""A model's shape as the performance model sees it: sizes and parameter counts, no weights
(from a config in the pytest process, or measured on the built model in a rank)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SIZES = (
    *("n_layer", "n_embd", "n_head", "n_query_groups", "head_size"),
    *("vocab_size", "padded_vocab_size", "intermediate_size"),
)
# A `transformers` config's name for each size (the first it has; GPT-2's names last).
HF_SIZE_NAMES = {
    "n_layer": ("num_hidden_layers", "n_layer"),
    "n_embd": ("hidden_size", "n_embd"),
    "n_head": ("num_attention_heads", "n_head"),
    "n_query_groups": ("num_key_value_heads",),
    "head_size": ("head_dim",),
    "vocab_size": ("vocab_size",),
    "padded_vocab_size": ("vocab_size",),
    "intermediate_size": ("intermediate_size", "n_inner"),
    "block_size": ("max_position_embeddings", "n_positions"),
}


def hf_sizes(config: Mapping[str, Any]) -> dict[str, int]:
    """The sizes a `transformers` config's JSON states, with its defaults: key/value heads =
    heads, head size = width / heads, an MLP 4x wide."""
    sizes: dict[str, int] = {}
    for size, names in HF_SIZE_NAMES.items():
        value = next((config[n] for n in names if isinstance(config.get(n), int)), None)
        if value is not None and not isinstance(value, bool) and value > 0:
            sizes[size] = value
    if "n_head" in sizes:
        sizes.setdefault("n_query_groups", sizes["n_head"])
        if "n_embd" in sizes:
            sizes.setdefault("head_size", max(sizes["n_embd"] // sizes["n_head"], 1))
    if "n_embd" in sizes:
        sizes.setdefault("intermediate_size", 4 * sizes["n_embd"])
    return sizes


@dataclass(frozen=True)
class ModelShape:
    n_layer: int  # shard units (transformer blocks)
    n_embd: int
    n_head: int
    n_query_groups: int  # == n_head: MHA, 1: MQA, in between: GQA
    head_size: int
    vocab_size: int  # tokens a prompt may contain
    padded_vocab_size: int  # rows of the embedding and the head
    intermediate_size: int
    block_size: int  # longest sequence the model accepts; 0: the model does not say
    block_params: int  # parameters of one shard unit (the mean, should units differ)
    non_block_params: int  # everything outside the units: embedding, final norm, head

    def __post_init__(self) -> None:
        for name in (*_SIZES, "block_params"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelShape: {name}={value!r} must be a positive int")
        for name in ("block_size", "non_block_params"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ModelShape: {name}={value!r} must be an int >= 0")

    def block_param_count(self) -> int:
        return self.block_params

    def non_block_param_count(self) -> int:
        return self.non_block_params

    @classmethod
    def from_config(
        cls,
        config: Any,
        *,
        block_params: int | None = None,
        non_block_params: int | None = None,
    ) -> ModelShape:
        """From any config with the shape's sizes; the parameter counts from its
        `block_param_count()`/`non_block_param_count()` unless given (LitGPT's has none)."""
        sizes = {name: int(getattr(config, name)) for name in _SIZES}
        return cls(
            **sizes,
            block_size=int(getattr(config, "block_size", 0) or 0),
            block_params=int(config.block_param_count() if block_params is None else block_params),
            non_block_params=int(
                config.non_block_param_count() if non_block_params is None else non_block_params
            ),
        )


def kv_cache_bytes(shape: ModelShape, batch: int, seq_length: int, dtype_bytes: int) -> float:
    """The static KV cache, read whole every decode step."""
    per_layer = 2 * batch * shape.n_query_groups * shape.head_size * seq_length * dtype_bytes
    return float(shape.n_layer * per_layer)
