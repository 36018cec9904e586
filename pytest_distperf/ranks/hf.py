"""A Hugging Face `transformers` causal LM as it is, through the plugin's model interface (issue
47): its own KV cache, `_no_split_modules` as shard units, `base_model_tp_plan` for `tp`, its
parts for `pipeline`. The one module that imports `transformers`, only for such models."""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytest_distperf.models import hf_config_path
from pytest_distperf.perfmodel.shape import hf_sizes
from pytest_distperf.ranks.weights import init_from_seed
from pytest_distperf.spec import HF_EXTRA


def is_hf_causal_lm(module: Any) -> bool:
    """A transformers model with an output head, told from its classes (importing nothing)."""
    if not any(
        kind.__name__ == "PreTrainedModel" and kind.__module__.startswith("transformers.")
        for kind in type(module).__mro__
    ):
        return False
    head = getattr(module, "get_output_embeddings", None)
    return callable(head) and head() is not None


@dataclass(frozen=True)
class Startup:
    """Seconds a rank spent importing transformers and building the model."""

    import_s: float
    build_s: float


def build_hf(
    model: str, test_dir: str, seed: int, device: torch.device, dtype: torch.dtype
) -> tuple[nn.Module, Startup]:
    """`AutoModelForCausalLM` from the config `hf:<config>` names, weights from `seed` alone
    (nothing downloaded), and what the import and build cost."""
    path = hf_config_path(model, test_dir)
    began = time.perf_counter()
    try:
        import transformers

        # transformers imports lazily: the classes below are the import's real cost.
        _ = transformers.AutoModelForCausalLM, transformers.StaticCache
    except ImportError as error:
        raise ImportError(f"model {model} needs transformers ({HF_EXTRA}): {error}") from error
    imported = time.perf_counter()
    config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    with torch.device(device):
        module = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    init_from_seed(module, seed)
    return module.eval(), Startup(imported - began, time.perf_counter() - imported)


class HFCausalLM(nn.Module):
    """An HF causal LM called as this project's models are: `forward(idx, input_pos)`,
    `setup_caches` / `clear_caches` (the model's own cache)."""

    def __init__(self, model: nn.Module, name: str) -> None:
        super().__init__()
        self.model = model
        self.name = name
        self.block_class = decoder_layers(model)
        forward = inspect.signature(model.forward).parameters
        # transformers renamed `past_key_values` to `cache` (5.2x); both are accepted here.
        self.cache_keyword = "cache" if "cache" in forward else "past_key_values"
        self.cache: Any = None
        self.static = False  # the cache's layers are plain static ones: positions set on device
        self.tp_ways = 1  # ranks its attention's heads are split over (tp sets it)
        # Every rank computes the same rotary tables: DDP need not broadcast them every forward.
        self._ddp_params_and_buffers_to_ignore = [buffer for buffer, _ in self.named_buffers()]

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] of idx [B, T] at positions input_pos [T]."""
        if input_pos is None or self.cache is None:  # training: the whole sequence, no cache
            return self.model(input_ids=idx, use_cache=False).logits
        self._seek(input_pos, idx.shape[1])
        output = self.model(
            input_ids=idx,
            position_ids=input_pos.unsqueeze(0),  # [1, T]
            use_cache=True,
            **{self.cache_keyword: self.cache},
        )
        return output.logits

    def next_token_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The model's own `loss_function` of logits [B, T, V] against next tokens [B, T]."""
        return self.model.loss_function(
            logits=logits,
            labels=None,
            vocab_size=logits.shape[-1],
            shift_labels=targets.contiguous(),
        )

    def _seek(self, input_pos: torch.Tensor, length: int) -> None:
        """Point the cache's writes at input_pos[0]: on the device for static layers (no host
        sync); a dynamic cache only appends, so a prompt of 2 or more tokens empties it."""
        if self.static:
            for layer in self.cache.layers:  # made on the device by setup_caches
                layer.cumulative_length.copy_(input_pos[0])
        elif length > 1:
            self.cache.reset()

    def setup_caches(
        self, max_batch_size: int, max_seq_length: int, device: torch.device, dtype: torch.dtype
    ) -> None:
        """A `StaticCache` where the model compiles whole and every layer of it is a plain static
        one (so decode steps keep one shape and compile), else a dynamic one."""
        import transformers
        from transformers.cache_utils import StaticLayer

        config = self.model.config
        if getattr(self.model, "_can_compile_fullgraph", False):
            self.cache = transformers.StaticCache(config=config, max_cache_len=max_seq_length)
            self.static = all(type(layer) is StaticLayer for layer in self.cache.layers)
            if self.static:
                self._make_layers(max_batch_size, device, dtype)
                return
        self.cache, self.static = transformers.DynamicCache(config=config), False

    def _make_layers(self, batch: int, device: torch.device, dtype: torch.dtype) -> None:
        """Keys and values made now (a compiled prefill cannot make them) with this rank's heads;
        a pipeline stage's dropped layers get a position counter only (the model reads the
        query's offset from the cache's first layer)."""
        config, heads = self.model.config, self.tp_heads()
        kv_heads = heads["num_key_value_heads"] // self.tp_ways
        width = config.hidden_size // heads["num_attention_heads"]
        head_dim = int(getattr(config, "head_dim", None) or width)
        empty = torch.zeros((batch, kv_heads, 0, head_dim), dtype=dtype, device=device)
        kept = {
            m.layer_idx
            for m in self.model.modules()
            if isinstance(getattr(m, "layer_idx", None), int)
        }
        for index, layer in enumerate(self.cache.layers):
            if not kept or index in kept:
                layer.lazy_initialization(empty, empty)
            else:
                layer.cumulative_length = torch.zeros((), dtype=torch.long, device=device)
                layer.is_initialized = True

    def clear_caches(self) -> None:
        self.cache, self.static = None, False

    def tp_plan(self) -> dict[str, str]:
        """The base model's `base_model_tp_plan`, named from this module."""
        plan = getattr(self.model.config, "base_model_tp_plan", None)
        if not plan:
            raise ValueError(
                f"tp: {type(self.model).__name__} ({self.name}) has no base_model_tp_plan in its "
                "config; name your own with @pytest.mark.distperf(tp_plan="
                "'package.module:function'), a function (model, tp_mesh) -> model"
            )
        prefix = f"model.{self.model.base_model_prefix}."
        return {prefix + pattern: style for pattern, style in plan.items()}

    def tp_heads(self) -> dict[str, int]:
        """The head counts a tensor-parallel split must divide."""
        config = self.model.config
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        return {"num_attention_heads": heads, "num_key_value_heads": kv_heads}

    def pipeline_parts(self) -> tuple[tuple[nn.Module, str], ...]:
        """(owner, attribute) of the embedding, layers, final norm and head: a stage's parts."""
        base = self.model.base_model
        found: dict[str, tuple[nn.Module, str]] = {}
        for attribute, child in base.named_children():
            if child is self.model.get_input_embeddings():
                found["embedding"] = (base, attribute)
            elif isinstance(child, nn.ModuleList) and any(
                isinstance(m, self.block_class) for m in child
            ):
                found["layers"] = (base, attribute)
            elif next(child.parameters(recurse=True), None) is not None:
                found.setdefault("norm", (base, attribute))  # the one other part with weights
        head = self.model.get_output_embeddings()
        for attribute, child in self.model.named_children():
            if child is head:
                found["head"] = (self.model, attribute)
        missing = [p for p in ("embedding", "layers", "norm", "head") if p not in found]
        if missing:
            raise TypeError(
                f"pipeline: {type(self.model).__name__} ({self.name}): no {', '.join(missing)} "
                "found as a direct part of the model, so its forward cannot be cut by layers"
            )
        return tuple(found[p] for p in ("embedding", "layers", "norm", "head"))


def decoder_layers(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The classes `_no_split_modules` names, as found in `model`."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return tuple({type(m): None for m in model.modules() if type(m).__name__ in names})


def version_and_sizes(model: nn.Module) -> tuple[str, dict[str, int]]:
    """The transformers version and the model's config sizes under the shape's names."""
    import transformers

    return str(transformers.__version__), hf_sizes(model.config.to_dict())
