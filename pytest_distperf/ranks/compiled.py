"""The compiled decode step (`distperf(compile=True)`), compiled before the warm-up: whole-graph
with CUDA graphs for a replicated strategy, around the hooks for a sharded or model-parallel
wrapper (CUDA graphs cannot hold their collectives); a strategy's own step stays eager."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from distperf_model.generate import decode_one_token, prefill

from pytest_distperf.platform import platform_of
from pytest_distperf.ranks.timing import StepOverride

Step = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]

# Calls that compile and settle the step: dynamo's trace, inductor, then CUDA graph warm-up and
# recording (cudagraph trees record on a later call than the first).
SETTLE_CALLS = 3
# Whole graphs (decode and prefill) replay as CUDA graphs: the host paces neither. Not
# max-autotune: its decode rate moved between sessions far more (h200-2026-12-01-gate2.md).
WHOLE_GRAPH_CUDA = "reduce-overhead"
AROUND_HOOKS_CUDA = "max-autotune-no-cudagraphs"


@dataclass(frozen=True)
class CompiledStep:
    step: Step | None  # None: this strategy's step stays eager
    how: str  # what ran, for the result: e.g. "torch.compile CUDA graphs, fullgraph"
    prefill: Step | None = None  # None: the prefill stays eager
    cuda_graphs: bool = False  # the step replays as a CUDA graph: the host does not pace it
    graph_breaks: bool = False  # compiled around the wrapper's hooks, which run between graphs

    def override(self) -> StepOverride | None:
        """What the timed loop runs instead of its own steps; None: all eager."""
        if self.step is None and self.prefill is None:
            return None
        return StepOverride(prefill=self.prefill, decode=self.step)


def compile_decode_step(
    inner: torch.nn.Module, device: torch.device, *, replicated: bool, own_step: bool
) -> CompiledStep:
    """The compiled steps for what the strategy built around `inner`."""
    if own_step:
        return CompiledStep(None, "eager: the strategy's own step sends and receives between ranks")
    if replicated:
        return compile_bare_step(inner, device)
    mode = AROUND_HOOKS_CUDA if platform_of(device.type).queues_kernels else None
    compiled = torch.compile(decode_one_token, mode=mode, dynamic=False)
    how = f"torch.compile {mode or 'default'}, graph breaks at the wrapper's hooks; prefill eager"
    return CompiledStep(compiled, how, graph_breaks=True)


def compile_bare_step(
    bare: torch.nn.Module, device: torch.device, with_prefill: bool = True
) -> CompiledStep:
    """A whole module's decode step and (`with_prefill`: where the wrapper's is) prefill,
    whole-graph: a replicated strategy's, or the bare model's the wrapper is measured against."""
    graphs = platform_of(device.type).queues_kernels
    mode = WHOLE_GRAPH_CUDA if graphs else None

    def whole_graph(function: Step) -> Step:
        compiled = torch.compile(function, mode=mode, fullgraph=True, dynamic=False)

        def call(model: Any, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            # A new CUDA-graph step each call, its output copied: the next replay overwrites it.
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(bare, idx, pos).clone()

        return call

    first = whole_graph(prefill) if with_prefill else None
    also = f" and prefill ({mode or 'default'})" if with_prefill else ""
    how = f"torch.compile fullgraph, decode ({mode or 'default'}){also}"
    return CompiledStep(whole_graph(decode_one_token), how, first, graphs)


def compile_run(
    wrapped: Any,
    inner: torch.nn.Module,
    bare: torch.nn.Module | None,
    prompt: torch.Tensor,
    sync: Callable[[], None],
    *,
    replicated: bool,
    own_step: bool,
) -> tuple[CompiledStep, CompiledStep | None, float]:
    """(the wrapped model's steps, the bare model's, seconds compiling and settling both); a
    bare model that is the replicated wrapper's `inner` shares its steps."""
    device = prompt.device
    compiled = compile_decode_step(inner, device, replicated=replicated, own_step=own_step)
    seconds = settle(compiled, wrapped, prompt, sync)
    bare_steps = compiled if replicated and bare is inner else None
    if bare is not None and bare_steps is None:
        bare_steps = compile_bare_step(bare, device, with_prefill=compiled.prefill is not None)
        seconds += settle(bare_steps, bare, prompt, sync)
    return compiled, bare_steps, seconds


def settle(
    compiled: CompiledStep, model: Any, prompt: torch.Tensor, sync: Callable[[], None]
) -> float:
    """Seconds compiling and warming `compiled`'s steps up on `model` (its KV cache set up)."""
    prompt_length = prompt.shape[1]
    token = prompt[:, -1:]  # [B, 1]
    pos = torch.tensor([prompt_length], device=prompt.device)  # [1]
    positions = torch.arange(prompt_length, device=prompt.device)  # [T]
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(SETTLE_CALLS):
            if compiled.prefill is not None:
                compiled.prefill(model, prompt, positions)
            if compiled.step is not None:
                token = compiled.step(model, token, pos)
    sync()
    return time.perf_counter() - start
