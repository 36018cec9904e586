"""The reference workload: a GPT decoder with KV cache and named configs.

Installed as `distperf_model`. Config and PRESETS import without torch (the performance model
sizes weights from them); the torch-backed names load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import PRESETS, Config

if TYPE_CHECKING:
    from .generate import decode_one_token, make_prompt, prefill, sample
    from .model import (
        GPT,
        Block,
        CausalSelfAttention,
        GptNeoxMLP,
        KVCache,
        LLaMAMLP,
        RMSNorm,
        build_model,
    )

_LAZY = {
    "GPT": "model",
    "Block": "model",
    "CausalSelfAttention": "model",
    "GptNeoxMLP": "model",
    "LLaMAMLP": "model",
    "KVCache": "model",
    "RMSNorm": "model",
    "build_model": "model",
    "make_prompt": "generate",
    "sample": "generate",
    "prefill": "generate",
    "decode_one_token": "generate",
}
# The generate() function is not re-exported: its name is taken by the submodule
# distperf_model.generate, and the import system would overwrite one with the other.

__all__ = [
    "GPT",
    "PRESETS",
    "Block",
    "CausalSelfAttention",
    "Config",
    "GptNeoxMLP",
    "KVCache",
    "LLaMAMLP",
    "RMSNorm",
    "build_model",
    "decode_one_token",
    "make_prompt",
    "prefill",
    "sample",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
