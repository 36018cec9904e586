"""The model a rank runs: a preset, a LitGPT or transformers config (weights from the seed) or a
builder's module, seen through `RankModel`, which says what a module lacks (docs/extending.md,
"Adding a model"). A transformers model runs as it is, through ranks/hf.py."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import inspect
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from distperf_model import Config, build_model
from torch import nn

from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.ranks.hf import (
    HFCausalLM,
    Startup,
    build_hf,
    decoder_layers,
    is_hf_causal_lm,
    version_and_sizes,
)
from pytest_distperf.ranks.weights import init_from_seed
from pytest_distperf.spec import LITGPT_EXTRA, LITGPT_PREFIX, Workload


def use_import_paths(paths: Iterable[str]) -> None:
    """Put the pytest process's import paths this rank lacks in front of its own, in their
    order: what a test imports, a rank can."""
    sys.path[:0] = [path for path in dict.fromkeys(paths) if path not in sys.path]


def load_object(path: str, what: str) -> Any:
    """`package.module:name` imported in this rank; the error names `what` asked for it."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(
            f"{what}: cannot import {module_name!r} in the rank ({error}); it must be importable "
            "in the pytest process (the test's directory, the rootdir or a conftest's sys.path)"
        ) from error
    try:
        return getattr(module, name)
    except AttributeError:
        raise AttributeError(f"{what}: module {module_name!r} has no {name!r}") from None


@dataclass(frozen=True)
class RankModel:
    """A built model and what the worker needs to know of it."""

    module: nn.Module
    # "distperf" (this project's caches, as gpt-fast's), "litgpt", or "" (the test's own loop)
    cache_api: str
    units: tuple[type[nn.Module], ...]  # the shard units (FSDP wraps or shards each)
    shape: ModelShape  # measured from the module (perfmodel terms, message sizes)
    name: str  # the model as the marker wrote it, for messages
    # LitGPT's rope tables, buffers DDP would broadcast: made and dropped with the caches
    rope_dtype: torch.dtype | None = None
    transformers_version: str = ""  # for a transformers model, the version that built it
    forward_methods: tuple[str, ...] = ()  # what the test's own loop calls in place of forward
    startup: Startup | None = None  # transformers' import and the build, for `hf:` models

    def setup_caches(
        self,
        max_batch_size: int,
        max_seq_length: int,
        device: torch.device,
        dtype: torch.dtype,
        module: nn.Module | None = None,
    ) -> None:
        """KV caches (and rope tables) for `module`, by default this model's own."""
        target = self.module if module is None else module
        seq = max_seq_length
        if self.cache_api == "distperf":
            target.setup_caches(
                max_batch_size=max_batch_size, max_seq_length=seq, device=device, dtype=dtype
            )
        elif self.cache_api == "litgpt":
            if self.rope_dtype is not None:
                target.max_seq_length = seq  # LitGPT's setter checks block_size, remakes tables
                cos, sin = target.rope_cache(device=device)
                target.register_buffer("cos", cos.to(self.rope_dtype), persistent=False)
                target.register_buffer("sin", sin.to(self.rope_dtype), persistent=False)
            # LitGPT-like `set_kv_cache` methods differ in which keywords they take.
            kwargs = {"max_seq_length": seq, "device": device, "dtype": dtype}
            parameters = inspect.signature(target.set_kv_cache).parameters
            if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
                kwargs = {k: v for k, v in kwargs.items() if k in parameters}
            target.set_kv_cache(max_batch_size, **kwargs)

    def clear_caches(self) -> None:
        if self.cache_api == "distperf":
            self.module.clear_caches()
        elif self.cache_api == "litgpt":
            self.module.clear_kv_cache()
            for name in ("cos", "sin") if self.rope_dtype is not None else ():
                if isinstance(getattr(self.module, name, None), torch.Tensor):
                    delattr(self.module, name)

    def check_fits(self, positions: int, what: str) -> None:
        """A rank's own check of the context, for models whose limit only a build tells."""
        limit = self.shape.block_size
        if limit and positions > limit:
            raise ValueError(
                f"{what} needs {positions} positions but model {self.name!r} accepts {limit}"
            )


def build(
    workload: Workload, device: torch.device, dtype: torch.dtype, test_dir: str = ""
) -> RankModel:
    """The workload's model on `device` in `dtype`, identical in every rank (and in every copy);
    `test_dir`: the test file's folder, where a relative `hf:<config>` is found."""
    name, startup = workload.model, None
    if workload.model_source == "preset":
        module: Any = build_model(Config.from_name(name), workload.seed, device, dtype)
    elif workload.model_source == "litgpt":
        module = build_litgpt(name[len(LITGPT_PREFIX) :], workload.seed, device, dtype)
    elif workload.model_source == "hf":
        module, startup = build_hf(name, test_dir, workload.seed, device, dtype)
    else:
        module = load_object(name, f"distperf(model={name!r})")(
            seed=workload.seed, device=device, dtype=dtype
        )
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"distperf(model={name!r}) returned {type(module).__name__}, not a torch.nn.Module"
            )
    built = adapt(module, name, workload.shard_unit, own_loop=workload.generate is not None)
    return dataclasses.replace(built, startup=startup)


def adapt(
    module: nn.Module, name: str, shard_unit: str | None = None, own_loop: bool = False
) -> RankModel:
    """`module` seen through one interface; a TypeError listing everything it lacks otherwise. A
    transformers causal LM runs in its adapter, or bare for the test's own loop (`own_loop`)."""
    hf_version, sizes = "", {}
    if is_hf_causal_lm(module):
        hf_version, sizes = version_and_sizes(module)
        module = module if own_loop else HFCausalLM(module, name)
    problems = []
    caches = _caches_of(module) or (("", None) if own_loop else None)
    if caches is None:
        cache_like = sorted(n for n in dir(type(module)) if "cache" in n.lower())
        has = f"; it has {', '.join(cache_like)}" if cache_like else ""
        problems.append(
            "KV cache methods: either setup_caches(max_batch_size, max_seq_length, device=, "
            "dtype=) and clear_caches() (this project's GPT), or set_kv_cache(batch_size, "
            f"max_seq_length, device=, dtype=) and clear_kv_cache() (LitGPT's GPT){has}"
        )
    try:
        inspect.signature(module.forward).bind(object(), object())
    except TypeError:
        problems.append(
            f"forward(idx, input_pos): its forward{inspect.signature(module.forward)} cannot "
            "take the token ids and their positions"
        )
    units = _units_of(module, shard_unit)
    if not units:
        problems.append(
            "a shard unit for FSDP: no nn.ModuleList of blocks (nor a class of its "
            "_no_split_modules) found; set `block_class` on the model or name it in the marker: "
            "distperf(shard_unit='package.module:Block')"
        )
    if _vocab_size(module) is None:
        problems.append(
            "a vocabulary size for the prompt: `config.vocab_size` or an nn.Embedding of tokens"
        )
    if problems or caches is None:
        lacks = "".join(f"\n  - {problem}" for problem in problems)
        raise TypeError(
            f"distperf(model={name!r}) built {type(module).__name__}, which lacks what a distperf "
            f"run needs:{lacks}\nProvide these on the module (docs/extending.md, 'Adding a model')."
        )
    # The test's own loop calls a bare transformers model's `generate`: through the wrapper.
    own = ("generate",) if hf_version and own_loop else ()
    shape = measure_shape(module, units, sizes)
    api, rope_dtype = caches
    return RankModel(module, api, units, shape, name, rope_dtype, hf_version, own)


def _caches_of(module: nn.Module) -> tuple[str, torch.dtype | None] | None:
    """(cache API, rope tables' dtype) of `module`; None for neither API."""

    def has(*names: str) -> bool:
        return all(callable(getattr(module, n, None)) for n in names)

    if has("setup_caches", "clear_caches"):
        return "distperf", None
    if has("set_kv_cache", "clear_kv_cache"):
        cos = getattr(module, "cos", None)
        rope = has("rope_cache") and isinstance(cos, torch.Tensor)
        return "litgpt", cos.dtype if rope else None
    return None


def _units_of(module: nn.Module, shard_unit: str | None) -> tuple[type[nn.Module], ...]:
    """The marker's `shard_unit`, else the model's `block_class`, else the class repeated in its
    largest nn.ModuleList (by parameters: the transformer blocks)."""
    if shard_unit:
        unit = load_object(shard_unit, f"distperf(shard_unit={shard_unit!r})")
        if not (isinstance(unit, type) and issubclass(unit, nn.Module)):
            raise TypeError(f"distperf(shard_unit={shard_unit!r}) is not an nn.Module class")
        return (unit,)
    # A bare transformers model (the test's own loop) names its decoder layers.
    declared = getattr(module, "block_class", None) or decoder_layers(module)
    if declared:
        return tuple(declared) if isinstance(declared, tuple) else (declared,)
    lists = [m for m in module.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        return ()
    # modules() walks outer lists first, and max() keeps the first of equals: the outermost.
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return (collections.Counter(type(m) for m in largest).most_common(1)[0][0],)


def _embedding(module: nn.Module) -> nn.Embedding | None:
    embeddings = [m for m in module.modules() if isinstance(m, nn.Embedding)]
    return max(embeddings, key=lambda m: m.num_embeddings, default=None)


def _vocab_size(module: nn.Module) -> int | None:
    size = getattr(getattr(module, "config", None), "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    embedding = _embedding(module)
    return embedding.num_embeddings if embedding is not None else None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def measure_shape(
    module: nn.Module, units: tuple[type[nn.Module], ...], sizes: dict[str, int] | None = None
) -> ModelShape:
    """The shape of a built (or meta) model: parameters per shard unit and outside them, sizes
    from `sizes` (a transformers config's) or its `config`, else one head and a 4x MLP (only the
    roofline's KV bytes read them)."""
    sizes = sizes or {}
    counts = {id(p): p.numel() for p in module.parameters()}
    outer: list[str] = []
    in_units: set[int] = set()
    for path, sub in module.named_modules():
        if isinstance(sub, units) and not any(path.startswith(f"{o}.") for o in outer):
            outer.append(path)
            in_units.update(id(p) for p in sub.parameters())
    n_layer = max(len(outer), 1)
    block = max(sum(counts[i] for i in in_units) // n_layer, 1)
    config = getattr(module, "config", None)
    embedding = _embedding(module)

    def size(name: str, fallback: int) -> int:
        value = sizes.get(name, getattr(config, name, None))
        return value if isinstance(value, int) and value > 0 else fallback

    n_embd = size("n_embd", embedding.embedding_dim if embedding is not None else 1)
    padded = size("padded_vocab_size", embedding.num_embeddings if embedding is not None else 1)
    n_head = size("n_head", 1)
    # The context: `config.block_size`, else a `max_seq_length` the model has set; 0 for neither.
    limits = (getattr(config, "block_size", None), getattr(module, "max_seq_length", None))
    return ModelShape(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_query_groups=size("n_query_groups", n_head),
        head_size=size("head_size", max(n_embd // n_head, 1)),
        vocab_size=_vocab_size(module) or padded,
        padded_vocab_size=padded,
        intermediate_size=size("intermediate_size", 4 * n_embd),
        block_size=sizes.get("block_size", next(filter(_positive, limits), 0)),
        block_params=block,
        non_block_params=max(sum(counts.values()) - block * n_layer, 0),
    )


def build_litgpt(
    config_name: str, seed: int, device: torch.device, dtype: torch.dtype
) -> nn.Module:
    """LitGPT's own GPT for `config_name`, weights from `seed` alone, built on meta and
    materialised in `dtype` (eagerly where its modules keep buffers beside the rope tables)."""
    try:
        from litgpt.config import Config as LitConfig
        from litgpt.model import GPT
    except ImportError as error:
        raise ImportError(
            f"model {LITGPT_PREFIX}{config_name} needs LitGPT ({LITGPT_EXTRA}): {error}"
        ) from error
    try:
        config = LitConfig.from_name(config_name)
    except ValueError as error:
        raise ValueError(
            f"model {LITGPT_PREFIX}{config_name}: {error} (litgpt.config.name_to_config)"
        ) from None
    with torch.device("meta"):
        module = GPT(config).to(dtype=dtype)
    if any(name not in ("cos", "sin") for name, _ in module.named_buffers()):
        torch.manual_seed(seed)  # state init_from_seed does not set: LitGPT's own init, seeded
        with torch.device(device):
            module = GPT(config).to(dtype=dtype)
    else:
        module = module.to_empty(device=device)
    cos, sin = module.rope_cache(device=device)
    module.register_buffer("cos", cos.to(dtype), persistent=False)
    module.register_buffer("sin", sin.to(dtype), persistent=False)
    init_from_seed(module, seed)
    return module.eval()
