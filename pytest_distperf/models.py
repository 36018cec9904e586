"""What `distperf(model=...)` names, known before any rank runs (no torch): a preset's or LitGPT
name's shape and context, an `hf:<config>`'s file and context; a builder's once a rank built it."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_distperf.measured import RunResult
from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.spec import HF_EXTRA, HF_PREFIX, LITGPT_EXTRA, LITGPT_PREFIX, Workload


class ModelError(ValueError):
    """A model name that cannot be used here; the message says why and what to do."""


@functools.cache
def _litgpt_config_module() -> ModuleType:
    """LitGPT's `config.py` (no torch), loaded alone: `import litgpt.config` runs torch's import."""
    if "litgpt.config" in sys.modules:
        return sys.modules["litgpt.config"]
    spec = importlib.util.find_spec("litgpt")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"LitGPT models need LitGPT, an optional extra: {LITGPT_EXTRA}")
    path = Path(list(spec.submodule_search_locations)[0]) / "config.py"
    name = "pytest_distperf._litgpt_config"
    file_spec = importlib.util.spec_from_file_location(name, path)
    if file_spec is None or file_spec.loader is None:
        raise ModelError(f"cannot load LitGPT's configurations from {path}")
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    file_spec.loader.exec_module(module)
    return module


def litgpt_config(config_name: str) -> Any:
    """LitGPT's `Config` for a name, without importing torch."""
    config_class = _litgpt_config_module().Config
    try:
        return config_class.from_name(config_name)
    except ValueError as error:
        raise ModelError(f"{error} (see litgpt.config.name_to_config)") from None


def context_limit(model: str, test_dir: str = "") -> int | None:
    """The named model's `block_size` (an HF config's `max_position_embeddings`); None for a
    builder. `test_dir`: where a relative `hf:` path starts."""
    source = Workload(model=model).model_source
    if source == "preset":
        from distperf_model.config import Config

        return Config.from_name(model).block_size
    if source == "litgpt":
        return int(litgpt_config(model[len(LITGPT_PREFIX) :]).block_size)
    if source == "hf":
        limit = hf_config(model, test_dir).get("max_position_embeddings")
        return limit if isinstance(limit, int) and limit > 0 else None
    return None


def hf_hub_cache() -> Path:
    """The local Hugging Face hub cache, found as `huggingface_hub` finds it."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "hub"


def _cached_config(hub_id: str) -> Path | None:
    """`config.json` of `hub_id` in the local cache: the snapshot `refs/main` names, else any."""
    repo = hf_hub_cache() / f"models--{hub_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip() / "config.json"
        if pinned.is_file():
            return pinned
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[0] if found else None


def hf_config_path(model: str, test_dir: str = "") -> Path:
    """The `config.json` `hf:<config>` names: a folder holding one or the file (relative to
    `test_dir`, or absolute), else a hub id in the local cache; nothing is downloaded."""
    name = model[len(HF_PREFIX) :] if model.startswith(HF_PREFIX) else model
    if not name.strip():
        raise ModelError(f"{HF_PREFIX}{name}: name a config folder, a config file or a hub id")
    path = Path(name).expanduser()
    if not path.is_absolute() and test_dir:
        path = Path(test_dir) / path
    if path.is_dir():
        if (path / "config.json").is_file():
            return path / "config.json"
        raise ModelError(f"{HF_PREFIX}{name}: folder {path} holds no config.json")
    if path.is_file():
        return path
    cached = _cached_config(name) if name.count("/") <= 1 and not name.endswith(".json") else None
    if cached is not None:
        return cached
    raise ModelError(
        f"{HF_PREFIX}{name}: no config at {path} (a folder holding config.json, or the file) and "
        f"no {name!r} in the local Hugging Face cache ({hf_hub_cache()}); pass a config folder "
        f"or file, or download the config first: `hf download {name} config.json` (weights are "
        f"drawn from the seed, none are needed; the model needs {HF_EXTRA})"
    )


def hf_config(model: str, test_dir: str = "") -> dict[str, Any]:
    """The JSON of `hf:<config>`'s config file; ModelError naming a file that is not one."""
    path = hf_config_path(model, test_dir)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelError(f"{model}: cannot read {path} as a JSON config: {error}") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelError(f'{model}: {path} is not a transformers config (no "model_type" in it)')
    return config


@functools.cache
def shape_of(model: str) -> ModelShape | None:
    """The shape of a preset or a LitGPT name; None for a builder or an HF config."""
    source = Workload(model=model).model_source
    if source == "preset":
        from distperf_model.config import Config

        return ModelShape.from_config(Config.from_name(model))
    if source in ("builder", "hf"):
        return None
    return litgpt_shape(litgpt_config(model[len(LITGPT_PREFIX) :]))


def run_shape(result: RunResult) -> ModelShape | None:
    """The shape a run's ranks measured on the model they built, else the name's."""
    if result.ranks and result.ranks[0].model_shape is not None:
        return result.ranks[0].model_shape
    workload = result.spec.workload
    return None if workload.is_custom_builder else shape_of(workload.model)


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _norm(config: Any, size: int) -> int:
    """Parameters of LitGPT's `config.norm_class(size)` (OLMo's LayerNorm has none)."""
    if config.norm_class_name == "RMSNorm":
        return size
    return 0 if "OLMo" in config.name else 2 * size


def _attention(config: Any) -> int:
    """LitGPT's CausalSelfAttention, or its MultiheadLatentAttention (`latent_attention`)."""
    c = config
    if c.latent_attention is not None:
        return (
            _linear(c.n_embd, c.q_lora_rank, c.attn_bias)
            + c.q_lora_rank  # q_a_norm, an RMSNorm whatever the config's norm class
            + _linear(c.q_lora_rank, c.n_head * c.qk_head_dim, c.bias)
            + _linear(c.n_embd, c.kv_lora_rank + c.qk_rope_head_dim, c.attn_bias)
            + c.kv_lora_rank  # kv_a_norm
            + _linear(
                c.kv_lora_rank, c.n_query_groups * (c.qk_nope_head_dim + c.v_head_dim), c.bias
            )
            + _linear(c.n_head * c.v_head_dim, c.n_embd, c.bias)
        )
    qkv = (c.n_head + 2 * c.n_query_groups) * c.head_size
    params = _linear(c.n_embd, qkv, c.bias or c.attn_bias)
    params += _linear(c.head_size * c.n_head, c.n_embd, c.bias)
    if c.norm_qk:
        olmo2 = c.norm_qk_type == "olmo2"
        params += _norm(c, c.n_head * c.head_size if olmo2 else c.head_size)
        params += _norm(c, c.n_query_groups * c.head_size if olmo2 else c.head_size)
    return params


def _mlp(config: Any, kind: str, width: int) -> int:
    c = config
    if kind == "GptNeoxMLP":  # fc, proj
        return _linear(c.n_embd, width, c.bias) + _linear(width, c.n_embd, c.bias)
    if kind in ("LLaMAMLP", "GemmaMLP"):  # fc_1, fc_2, proj
        return 2 * _linear(c.n_embd, width, c.bias) + _linear(width, c.n_embd, c.bias)
    if kind == "LLaMAMoE":
        each = c.moe_intermediate_size or c.intermediate_size  # as LLaMAMLP takes it
        shared = c.n_shared_expert or 0
        params = c.n_expert * (c.n_embd + _mlp(c, "LLaMAMLP", each))  # a gate row per expert
        return params + (_mlp(c, "LLaMAMLP", each * shared) if shared else 0)
    raise ModelError(f"LitGPT model {config.name!r}: unknown mlp_class_name {kind!r}")


def _block(config: Any, index: int) -> int:
    """One LitGPT `Block`'s parameters (blocks before `first_k_dense_replace` are dense)."""
    c = config
    dense = c.first_k_dense_replace is not None and index < c.first_k_dense_replace
    mlp = _mlp(c, "LLaMAMLP" if dense else c.mlp_class_name, c.intermediate_size)
    norms = (c.norm_1, c.post_attention_norm, c.norm_2 and not c.shared_attention_norm)
    return (sum(norms) + c.post_mlp_norm) * _norm(c, c.n_embd) + _attention(c) + mlp


def litgpt_shape(config: Any) -> ModelShape:
    """The shape of LitGPT's `GPT(config)` counted from its config, per block (the mean) and
    outside them, as `ranks.models.measure_shape` counts a built one."""
    blocks = sum(_block(config, i) for i in range(config.n_layer))
    outside = (
        config.padded_vocab_size * config.n_embd  # wte
        + _norm(config, config.n_embd)  # ln_f
        + _linear(config.n_embd, config.padded_vocab_size, config.lm_head_bias)
    )
    block = blocks // config.n_layer
    return ModelShape.from_config(
        config, block_params=block, non_block_params=outside + blocks - block * config.n_layer
    )
