"""Issue 44's user: LitGPT's own GPT (pythia-410m shape, random weights) from a plain builder.
SYNC_PER_BLOCK=1 ends every block's forward with `torch.cuda.synchronize()` (timing code left
in: the same kernels, ops, FLOPs and tokens); the environment switch keeps the test's identity,
and so its baseline, the same. The own loop with `.item()` per token is
docs/benchmarks/cpu/verdict_models.py's `greedy` with VERDICT_SYNC=1."""

from __future__ import annotations

import os
from typing import Any

import torch


def litgpt_pythia(seed: int, device: torch.device, dtype: torch.dtype) -> Any:
    from litgpt.config import Config
    from litgpt.model import GPT

    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(Config.from_name(os.environ.get("SYNC_MODEL", "pythia-410m")))
    model = model.to(dtype)
    if os.environ.get("SYNC_PER_BLOCK") == "1":
        for block in model.transformer.h:
            block.register_forward_hook(lambda *args: torch.cuda.synchronize())
    return model
