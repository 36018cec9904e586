"""Weights from the seed alone: every rank and every copy of a model holds the same ones without a
broadcast (LitGPT's and transformers' models, built in ranks/models.py and ranks/hf.py)."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def _param_seed(seed: int, name: str) -> int:
    # A keyed digest, not hash() (salted per interpreter); low 32 bits depend on both inputs,
    # since the CPU generator only uses those.
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


@torch.no_grad()
def init_from_seed(module: nn.Module, seed: int) -> None:
    """Every parameter from (seed, its name) alone: biases 0, other vectors (norm scales) 1,
    matrices N(0, 0.02) drawn in float32; the same whatever the build order, device history or
    dtype, so every rank and every copy holds the same weights without a broadcast."""
    for name, p in module.named_parameters():
        if name.rsplit(".", 1)[-1] == "bias":
            p.zero_()
        elif p.dim() < 2:
            p.fill_(1.0)
        else:
            generator = torch.Generator(device=p.device)
            generator.manual_seed(_param_seed(seed, name))
            draw = torch.empty(p.shape, dtype=torch.float32, device=p.device)
            p.copy_(draw.normal_(0.0, 0.02, generator=generator))
