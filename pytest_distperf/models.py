"""What `distperf(model=...)` names, as the pytest process knows it before any rank runs: the
model's shape (for the performance model and the calibration's message sizes) and its context.

Presets come from `distperf_model.config` (no torch); a LitGPT name is LitGPT's model counted on
the meta device (torch and litgpt are imported then, for such tests only); a user's builder is
known only once a rank has built it (`RankResult.model_shape`). No torch at import.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.spec import LITGPT_EXTRA, LITGPT_PREFIX, RunResult, Workload


class ModelError(ValueError):
    """A model name that cannot be used here; the message says why and what to do."""


def litgpt_installed() -> bool:
    return importlib.util.find_spec("litgpt") is not None


@functools.cache
def _litgpt_config_module() -> ModuleType:
    """LitGPT's `config.py`, which imports no torch by design; loaded alone when the package is
    not imported yet, since `import litgpt.config` runs `litgpt/__init__` (torch, Lightning)."""
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


def context_limit(model: str) -> int | None:
    """The longest sequence the named model accepts (its config's `block_size`); None for a
    builder, whose ranks check it once the model is built."""
    source = Workload(model=model).model_source
    if source == "preset":
        from distperf_model.config import Config

        return Config.from_name(model).block_size
    if source == "litgpt":
        return int(litgpt_config(model[len(LITGPT_PREFIX) :]).block_size)
    return None


@functools.cache
def shape_of(model: str) -> ModelShape | None:
    """The shape of a preset or a LitGPT name; None for a builder (known after its build)."""
    source = Workload(model=model).model_source
    if source == "preset":
        from distperf_model.config import Config

        return ModelShape.from_config(Config.from_name(model))
    if source == "builder":
        return None
    litgpt_config(model[len(LITGPT_PREFIX) :])  # the extra and the name, checked without torch
    from pytest_distperf.ranks.models import litgpt_shape

    return litgpt_shape(model[len(LITGPT_PREFIX) :])


def run_shape(result: RunResult) -> ModelShape | None:
    """The shape a run's prediction uses: from the name where it tells, else as the ranks
    measured the model they built."""
    workload = result.spec.workload
    if workload.is_custom_builder:
        return result.ranks[0].model_shape if result.ranks else None
    return shape_of(workload.model)
