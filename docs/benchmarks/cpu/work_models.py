"""Builders for cpu_work_targets.sh: LitGPT's pythia-14m from a plain builder, as a user writes
one, with two changes a user might make by accident, each switched on by an environment
variable the ranks inherit:

* WORK_EXTRA_HEAD=F: every forward also multiplies its last hidden states by a second head of
  F x vocab columns (extra computation, no communication);
* WORK_ALL_REDUCE=1: every block all-reduces 64 bytes after its forward (16 fp32 zeros).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from litgpt.config import Config
from litgpt.model import GPT

ALL_REDUCE_ELEMENTS = 16  # 64 bytes of fp32


def pythia(seed: int, device: torch.device, dtype: torch.dtype) -> GPT:
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(Config.from_name("pythia-14m"))
    extra = float(os.environ.get("WORK_EXTRA_HEAD", "0"))
    if extra:
        _add_second_head(model, extra, device)
    if os.environ.get("WORK_ALL_REDUCE") == "1":
        for block in model.transformer.h:
            block.register_forward_hook(_all_reduce_64_bytes)
    return model.to(dtype)


def _add_second_head(model: GPT, fraction: float, device: torch.device) -> None:
    # A buffer, not a parameter: sharding leaves it whole, so the change is computation alone.
    config = model.config
    columns = int(fraction * config.padded_vocab_size)
    model.register_buffer(
        "second_head", torch.randn(columns, config.n_embd, device=device), persistent=False
    )

    def also_second_head(_head: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        torch.nn.functional.linear(args[0], model.second_head)  # computed and dropped

    model.lm_head.register_forward_hook(also_second_head)


def _all_reduce_64_bytes(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(torch.zeros(ALL_REDUCE_ELEMENTS, device=output.device))
