"""Strategy name -> how Lightning Fabric builds it, and where it can run.

The registry itself is torch-free so that the plugin can validate markers at collection; torch
and Lightning are imported only when a rank builds a strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any


@dataclass(frozen=True)
class StrategySpec:
    name: str
    description: str
    sharded: bool  # parameters are sharded across ranks (model built full, then sharded)
    build: Callable[[str, int], Any]  # (accelerator, devices) -> a Fabric strategy or its name


def _auto(accelerator: str, devices: int) -> Any:
    return "auto"  # Fabric's own choice: DDP for several devices, single device for one


def _ddp(accelerator: str, devices: int) -> Any:
    from lightning.fabric.strategies import DDPStrategy

    return DDPStrategy()


def _fsdp2(reshard_after_forward: bool, accelerator: str, devices: int) -> Any:
    from distperf_model.parallelize import fully_shard_blocks
    from lightning.fabric.strategies import ModelParallelStrategy

    return ModelParallelStrategy(
        parallelize_fn=partial(fully_shard_blocks, reshard_after_forward=reshard_after_forward),
        data_parallel_size=devices,
        tensor_parallel_size=1,
    )


def _fsdp(accelerator: str, devices: int) -> Any:
    # The seed's exact setup on CUDA: FSDP1 with one unit per transformer block. Fabric's FSDP
    # refuses to run on CPU, where the same sharding comes from FSDP2's fully_shard on gloo.
    if accelerator != "cuda":
        return _fsdp2(True, accelerator, devices)
    from lightning.fabric.strategies import FSDPStrategy

    return FSDPStrategy(auto_wrap_policy=_wrap_blocks, sharding_strategy="FULL_SHARD")


# The FSDP1 wrap unit is the built model's `block_class`, known only once the rank has built
# it (a user's builder brings its own); the worker sets it before the model is wrapped.
_wrap_units: tuple[type, ...] = ()


def set_wrap_unit(block_class: type) -> None:
    global _wrap_units
    _wrap_units = (block_class,)


def _wrap_blocks(module: Any, recurse: bool, nonwrapped_numel: int) -> bool:
    # FSDP1's policy protocol: descend everywhere, wrap each transformer block as one unit.
    return True if recurse else isinstance(module, _wrap_units)


STRATEGIES: dict[str, StrategySpec] = {
    s.name: s
    for s in (
        StrategySpec(
            "auto", "Fabric's default: DDP for N > 1, every rank holds the model", False, _auto
        ),
        StrategySpec("ddp", "explicit DDP: every rank holds the whole model", False, _ddp),
        StrategySpec(
            "fsdp",
            "full sharding, weights all-gathered every forward (CUDA: FSDP1 per block; CPU: FSDP2)",
            True,
            _fsdp,
        ),
        StrategySpec(
            "fsdp2",
            "FSDP2 fully_shard per block, resharded after every forward",
            True,
            partial(_fsdp2, True),
        ),
        StrategySpec(
            "fsdp-noreshard",
            "FSDP2 sharded storage; gathered weights kept across steps (no per-token gather)",
            True,
            partial(_fsdp2, False),
        ),
    )
}


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def get_strategy(name: str) -> StrategySpec:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None


def describe_implementation(fabric: Any, module: Any) -> tuple[str, str, str]:
    """(Fabric strategy class, sharding, wrapper class) of what actually ran in this rank."""
    strategy = type(fabric.strategy).__name__
    inner = getattr(module, "_forward_module", module)
    wrapper = type(inner).__name__
    sharding = "replicated"
    if strategy == "FSDPStrategy":
        sharding = f"FSDP1 {fabric.strategy.sharding_strategy.name}"
    else:
        from torch.distributed.fsdp import FSDPModule

        original = getattr(module, "module", module)
        blocks = [m for m in original.modules() if isinstance(m, FSDPModule)]
        if blocks:
            reshard = _fsdp2_reshards(blocks[-1])
            sharding = f"FSDP2 reshard_after_forward={reshard}"
    return strategy, sharding, wrapper


def _fsdp2_reshards(module: Any) -> bool | str:
    # FSDP2 keeps this flag on the module's parameter group; read it rather than trusting the
    # registry, so the result says what ran.
    state = module._get_fsdp_state()
    group = state._fsdp_param_group
    if group is None:
        return "unknown"
    return bool(group.post_forward_mesh_info is not None)
