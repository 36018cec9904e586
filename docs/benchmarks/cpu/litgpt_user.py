"""Issue 45's user suite: LitGPT's GPT (pythia-14m, random weights) from a plain builder, as a
user writes one. USER_WAIT_SHARE=S makes every attention call sleep its part of S of the new
wall time per token (tok/s drops by S); the environment switch keeps the test's identity."""

from __future__ import annotations

import os
import time
from typing import Any

import torch


def pythia(seed: int, device: torch.device, dtype: torch.dtype) -> Any:
    from litgpt.config import Config
    from litgpt.model import GPT

    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(Config.from_name("pythia-14m"))
    model = model.to(dtype)
    share = float(os.environ.get("USER_WAIT_SHARE", "0"))
    if share:
        _wait_per_attention_call(model, share)
    return model


def _wait_per_attention_call(model: Any, share: float) -> None:
    """Each attention call sleeps share / (1 - share) of the last forward's own time, split
    over the blocks."""
    state = {"start": 0.0, "added": 0.0, "last": 0.0}
    part = share / (1 - share) / len(model.transformer.h)

    def started(*_: object) -> None:
        state["start"], state["added"] = time.perf_counter(), 0.0

    def wait(*_: object) -> None:
        seconds = part * state["last"]
        time.sleep(seconds)
        state["added"] += seconds

    def done(*_: object) -> None:
        state["last"] = time.perf_counter() - state["start"] - state["added"]

    model.register_forward_pre_hook(started)
    model.register_forward_hook(done)
    for block in model.transformer.h:
        block.attn.register_forward_hook(wait)
