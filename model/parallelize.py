"""Parallelism applied to a built model, kept out of model.py (the torchtitan split)."""

from __future__ import annotations

from typing import Any

from torch import nn


def fully_shard_blocks(
    model: nn.Module, device_mesh: Any, reshard_after_forward: bool
) -> nn.Module:
    """FSDP2: one unit per transformer block plus the root (embedding, final norm, head).

    `device_mesh` is the mesh Fabric's ModelParallelStrategy passes; only its data-parallel
    dimension shards parameters. With `reshard_after_forward=False` the gathered weights stay in
    place after each forward, so decode steps after the first need no all-gather at all.
    """
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"] if device_mesh.mesh_dim_names else device_mesh
    block_class = getattr(model, "block_class", None)
    units = [m for m in model.modules() if block_class is not None and isinstance(m, block_class)]
    for block in units:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model
