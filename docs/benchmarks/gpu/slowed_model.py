"""The reference model with real extra work in every block, for proving the gate sees it.

`build` is a distperf builder (`distperf(model="slowed_model:build")`); with
DISTPERF_EXTRA_WORK=F (a fraction, e.g. 0.05) every block also streams a scratch buffer sized to
F x that block's weight bytes (read and written once per forward), so the whole decode does
about F more device-memory traffic, inside the compiled graph like the model's own work. Unset,
the model is the plain preset: unchanged and slowed runs share one test identity and baseline.
"""

from __future__ import annotations

import os

import torch
from distperf_model.config import Config
from distperf_model.model import build_model

PRESET = os.environ.get("DISTPERF_SLOWED_PRESET", "llama-2-7b")


def build(seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    model = build_model(Config.from_name(PRESET), seed=seed, device=device, dtype=dtype)
    fraction = float(os.environ.get("DISTPERF_EXTRA_WORK", "0") or 0)
    if fraction > 0:
        for block in model.transformer.h:
            _add_extra_work(block, fraction, device, dtype)
    return model


def _add_extra_work(block: torch.nn.Module, fraction: float, device, dtype) -> None:
    weight_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
    # read + write of the buffer: 2 x its bytes per forward
    elements = int(weight_bytes * fraction / 2 / torch.finfo(dtype).bits * 8)
    block.register_buffer("extra_work", torch.zeros(elements, device=device, dtype=dtype))
    forward = block.forward

    def slowed(*args, **kwargs):
        block.extra_work.add_(1.0)  # one full read and write of the buffer
        return forward(*args, **kwargs)

    block.forward = slowed
