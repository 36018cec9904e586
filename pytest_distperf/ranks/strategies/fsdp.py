"""Rank halves of the fully sharded strategies (`fsdp`, `fsdp2`, `fsdp-noreshard`), one unit
per transformer block: on CUDA `fsdp` is FSDP1 FULL_SHARD (Fabric's FSDPStrategy); elsewhere,
and for `fsdp2` everywhere, FSDP2's `fully_shard` per block through `ModelParallelStrategy`."""

from __future__ import annotations

from functools import partial
from typing import Any

from distperf_model.parallelize import fully_shard_blocks

from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy


def _build_fsdp2(reshard_after_forward: bool, context: BuildContext) -> Any:
    shard = partial(
        fully_shard_blocks,
        reshard_after_forward=reshard_after_forward,
        unit_classes=context.wrap_units,
    )
    return fabric_module("strategies").ModelParallelStrategy(
        parallelize_fn=shard, data_parallel_size=context.devices, tensor_parallel_size=1
    )


def _build_fsdp(context: BuildContext) -> Any:
    if context.platform.fsdp != "FSDP1":
        return _build_fsdp2(True, context)
    # A set of classes: Fabric makes it FSDP1's ModuleWrapPolicy, one unit per block.
    return fabric_module("strategies").FSDPStrategy(
        auto_wrap_policy=set(context.wrap_units), sharding_strategy="FULL_SHARD"
    )


def _describe_sharding(fabric: Any, module: Any) -> str:
    # Read from the wrapped module, not from the record, so the result says what ran.
    if type(fabric.strategy).__name__ == "FSDPStrategy":
        return f"FSDP1 {fabric.strategy.sharding_strategy.name}"
    from torch.distributed.fsdp import FSDPModule

    original = getattr(module, "module", module)
    blocks = [m for m in original.modules() if isinstance(m, FSDPModule)]
    if not blocks:
        return "replicated"
    # FSDP2 keeps this flag on the module's parameter group.
    group = blocks[-1]._get_fsdp_state()._fsdp_param_group
    reshards = "unknown" if group is None else group.post_forward_mesh_info is not None
    return f"FSDP2 reshard_after_forward={reshards}"


HALVES = tuple(
    RankStrategy(name, build=build, describe_sharding=_describe_sharding)
    for name, build in (
        ("fsdp", _build_fsdp),
        ("fsdp2", partial(_build_fsdp2, True)),
        ("fsdp-noreshard", partial(_build_fsdp2, False)),
    )
)
