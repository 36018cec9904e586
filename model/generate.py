"""Prefill, one decode step and the generation loop (gpt-fast style).

`model` is any callable `model(idx, input_pos) -> logits` (a bare GPT, or one wrapped by Fabric,
FSDP or DDP), so these functions only call it and never reach into its attributes. Nothing here
reads a device tensor back to the host: timing code decides where to synchronise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .config import Config

ModelFn = Callable[[Tensor, Tensor], Tensor]


def make_prompt(
    config: Config,
    batch_size: int,
    prompt_length: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> Tensor:
    """Random token ids [B, T] in [0, vocab_size), identical on every rank and device type."""
    # drawn on the CPU, then moved: CUDA and CPU generators give different streams
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (batch_size, prompt_length), generator=g)
    return idx.to(device)  # [B, T] int64


def sample(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next token [B, 1] from logits [B, V]; temperature 0 is greedy argmax."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1, keepdim=True)  # [B, 1]
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # [B, V]
    # exponential-race sampling instead of torch.multinomial, which syncs with the host on CUDA
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1, keepdim=True)  # [B, 1]


def prefill(
    model: ModelFn,
    idx: Tensor,
    input_pos: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Run the prompt idx [B, T] at positions input_pos [T]; return the next token [B, 1]."""
    logits = model(idx, input_pos)  # [B, T, V]
    return sample(logits[:, -1], temperature, top_k, generator)


def decode_one_token(
    model: ModelFn,
    token: Tensor,
    input_pos: Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One decode step: token [B, 1] at position input_pos [1] -> next token [B, 1]."""
    logits = model(token, input_pos)  # [B, 1, V]
    return sample(logits[:, -1], temperature, top_k, generator)


def generate(
    model: ModelFn,
    prompt: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Prompt [B, T] -> [B, T + max_new_tokens].

    The caller must have run setup_caches with max_batch_size >= B and max_seq_length >=
    T + max_new_tokens. Runs under no_grad rather than inference_mode: inference tensors clash
    with FSDP2/DTensor parameters in some torch versions.
    """
    B, T = prompt.shape
    with torch.no_grad():
        out = torch.empty(B, T + max_new_tokens, dtype=prompt.dtype, device=prompt.device)
        out[:, :T] = prompt
        if max_new_tokens == 0:
            return out
        input_pos = torch.arange(T, device=prompt.device)  # [T]
        token = prefill(model, prompt, input_pos, temperature, top_k, generator)  # [B, 1]
        out[:, T : T + 1] = token
        input_pos = torch.tensor([T], device=prompt.device)  # [1]
        for i in range(1, max_new_tokens):
            token = decode_one_token(model, token, input_pos, temperature, top_k, generator)
            out[:, T + i : T + i + 1] = token
            input_pos = input_pos + 1  # stays on device: no host round trip per step
    return out
