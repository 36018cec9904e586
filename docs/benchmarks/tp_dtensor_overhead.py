"""tp's eager cost on two gloo CPU ranks: one decode step of the whole model, of the built-in
DTensor plan, and of the same split by hand (plain weight shards, `dist.all_reduce` in forward
hooks, as LitGPT's generate/tp.py does it), plus a tight loop of activation all-reduces.

    python docs/benchmarks/tp_dtensor_overhead.py tiny pythia-14m cpu-110m

Written while the built-in plan (`tensor_parallel`) used DTensor; it is now the split by hand,
so its "DTensor tp" column measures the by-hand split too. The figures it gave then are in
tp-cpu-2026-12-01.md.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from distperf_model.config import Config
from distperf_model.model import build_model
from distperf_model.parallelize import _group_qkv_by_rank, tensor_parallel
from torch.distributed.device_mesh import init_device_mesh

WORLD = 2


def _step_ms(model: Any, steps: int = 50) -> float:
    token, position = torch.zeros(1, 1, dtype=torch.long), torch.tensor([3])
    with torch.no_grad():
        for _ in range(5):
            model(token, position)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            model(token, position)
    return (time.perf_counter() - start) / steps * 1e3


def _shard(linear: torch.nn.Linear, dim: int, rank: int) -> None:
    linear.weight = torch.nn.Parameter(linear.weight.chunk(WORLD, dim)[rank].clone())
    if linear.bias is not None and dim == 0:
        linear.bias = torch.nn.Parameter(linear.bias.chunk(WORLD)[rank].clone())
    elif linear.bias is not None and rank:
        linear.bias.data.zero_()  # a row-wise bias is added once, after the sum


def _all_reduce(module: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(out)
    return out


def _by_hand(cfg: Config, rank: int) -> Any:
    model = build_model(cfg, seed=7)
    for block in model.transformer.h:
        attn, mlp = block.attn, block.mlp
        _group_qkv_by_rank(attn.qkv, attn.n_head, attn.n_query_groups, WORLD)
        _shard(attn.qkv, 0, rank)
        _shard(attn.proj, 1, rank)
        attn.n_head //= WORLD
        attn.n_query_groups //= WORLD
        _shard(mlp.fc, 0, rank)
        _shard(mlp.proj, 1, rank)
        attn.proj.register_forward_hook(_all_reduce)
        mlp.proj.register_forward_hook(_all_reduce)
    return model


def _rank(rank: int, names: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    cpu, fp32 = torch.device("cpu"), torch.float32
    for name in names:
        cfg = Config.from_name(name)
        whole = build_model(cfg, seed=7)
        whole.setup_caches(1, 20)
        dtensor = tensor_parallel(build_model(cfg, seed=7), mesh)
        dtensor.setup_caches(1, 20, device=cpu, dtype=fp32)
        hand = _by_hand(cfg, rank)
        hand.setup_caches(1, 20)
        times = [_step_ms(m) for m in (whole, dtensor, hand)]
        activation = torch.ones(cfg.n_embd)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(200):
            dist.all_reduce(activation)
        reduce_ms = (time.perf_counter() - start) / 200 * 1e3
        if rank == 0:
            print(
                f"{name}: whole {times[0]:.3f} ms, DTensor tp {times[1]:.3f} ms, by hand "
                f"{times[2]:.3f} ms, one all-reduce {reduce_ms:.3f} ms "
                f"({2 * cfg.n_layer} per step)",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_rank, args=(sys.argv[1:] or ["tiny"],), nprocs=WORLD)
