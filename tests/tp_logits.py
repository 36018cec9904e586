"""Logits of a short greedy generation, shared by the tensor-parallel tests in and across ranks."""

from __future__ import annotations

from typing import Any

import torch


def greedy_logits(model: Any) -> list[torch.Tensor]:
    """Prefill and three greedy decode steps; each step's last logits [B, V]. The KV cache is
    made here, once the model is split or placed, as the worker makes it: tp's holds only this
    rank's query groups."""
    if hasattr(model, "setup_caches"):
        model.setup_caches(2, 16, device=torch.device("cpu"), dtype=torch.float32)
    else:  # LitGPT's GPT
        model.set_kv_cache(batch_size=2, max_seq_length=16)
    prompt = torch.randint(0, 200, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = [model(prompt, torch.arange(5))[:, -1]]
        for step in range(3):
            token = out[-1].argmax(-1, keepdim=True)
            out.append(model(token, torch.tensor([5 + step]))[:, -1])
    return out
