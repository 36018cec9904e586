"""The compiled decode step (`distperf(compile=True)`, `--distperf-compile`).

An eager decode at batch 1 is bound by the host issuing kernels, which is both slower than the
device allows and the noisiest part of a GPU runner (docs/benchmarks). Compiling the decode step
makes it device-bound. How depends on what wraps the model:

* a replicated strategy's inference forward has no collective, so the step calls the module the
  wrapper holds, whole-graph, with CUDA graphs on CUDA (`mode="reduce-overhead"`);
* a sharded or model-parallel wrapper runs hooks and collectives between layers: the step is
  compiled around them (graph breaks allowed) and without CUDA graphs, which cannot hold
  collectives issued from those hooks;
* a strategy with its own step that sends and receives between ranks (pipeline) stays eager.

The prefill stays eager: it runs once per generation, and a graph of its own would need more
warm-up generations before it replays. Compilation happens before the warm-up and is reported
as `compile_s`, never in the timed figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from distperf_model.generate import decode_one_token

Step = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]

# Calls that compile and settle the step: dynamo's trace, inductor, then CUDA graph warm-up and
# recording (cudagraph trees record on a later call than the first).
SETTLE_CALLS = 3


@dataclass(frozen=True)
class CompiledStep:
    step: Step | None  # None: this strategy's step stays eager
    how: str  # what ran, for the result: e.g. "torch.compile reduce-overhead, fullgraph"


def compile_decode_step(
    wrapped: Any,
    inner: torch.nn.Module,
    device: torch.device,
    *,
    replicated: bool,
    own_step: bool,
) -> CompiledStep:
    """The compiled decode step for `wrapped` (what the strategy built around `inner`)."""
    if own_step:
        return CompiledStep(None, "eager: the strategy's own step sends and receives between ranks")
    cuda = device.type == "cuda"
    if replicated:
        mode = "reduce-overhead" if cuda else None
        compiled = torch.compile(decode_one_token, mode=mode, fullgraph=True, dynamic=False)
        how = f"torch.compile {mode or 'default'}, fullgraph, on the module the wrapper holds"
        return CompiledStep(_graph_safe(lambda model, idx, pos: compiled(inner, idx, pos)), how)
    mode = "max-autotune-no-cudagraphs" if cuda else None
    compiled = torch.compile(decode_one_token, mode=mode, dynamic=False)
    how = f"torch.compile {mode or 'default'}, graph breaks at the wrapper's hooks, no CUDA graphs"
    return CompiledStep(compiled, how)


def compile_bare_step(bare: torch.nn.Module, device: torch.device) -> Step:
    """The bare model's step, compiled as a replicated one: what the wrapper is measured against."""
    mode = "reduce-overhead" if device.type == "cuda" else None
    compiled = torch.compile(decode_one_token, mode=mode, fullgraph=True, dynamic=False)
    return _graph_safe(lambda model, idx, pos: compiled(bare, idx, pos))


def _graph_safe(step: Step) -> Step:
    """A CUDA graph's output lives in memory its next replay overwrites, and each step's token
    is the next step's input: mark each call as a new step and keep a copy of its token."""

    def call(model: Any, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return step(model, idx, pos).clone()

    return call


def settle(step: Step, model: Any, prompt: torch.Tensor, sync: Callable[[], None]) -> float:
    """Compile and warm `step` up on `model` (its KV cache set up); the seconds it took."""
    batch, prompt_length = prompt.shape
    token = prompt[:, -1:]  # [B, 1]
    pos = torch.tensor([prompt_length], device=prompt.device)  # [1]
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(SETTLE_CALLS):
            token = step(model, token, pos)
    sync()
    return time.perf_counter() - start
