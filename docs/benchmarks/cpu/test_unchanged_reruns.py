"""Issue 45's user suite (docs/benchmarks/cpu_unchanged_reruns.sh): a LitGPT pythia-14m from a
plain builder under `auto` and `fsdp`, every gate at its default. UNCHANGED_SPIN=S makes every
attention call spin S seconds first (a model slower by itself) without changing the test's
identity, so the slowed sessions meet the unchanged baselines."""

from __future__ import annotations

import os
import time

import pytest


def pythia(seed, device, dtype):
    import torch
    from litgpt.config import Config
    from litgpt.model import GPT

    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(Config.from_name("pythia-14m"))
    spin = float(os.environ.get("UNCHANGED_SPIN", "0"))
    if spin:
        for block in model.transformer.h:
            block.attn.forward = _spinning(block.attn.forward, spin)
    return model.to(dtype)


def _spinning(forward, seconds):
    def slowed(*args, **kwargs):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return forward(*args, **kwargs)

    return slowed


@pytest.mark.strategy("auto", "fsdp")
@pytest.mark.distperf(model="test_unchanged_reruns:pythia", max_new_tokens=4, batch_size=2)
def test_builder(distperf):
    distperf.run()
