"""Tiny transformers models for the suite: configs written to a folder, as a user keeps one
beside their tests (`distperf(model="hf:<folder>")`), and the tokens of their own `generate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Small enough for two CPU ranks; 4 heads split by tp, 4 layers by pipeline. No end-of-sequence
# token: every generation runs its whole length.
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "eos_token_id": None,
    "bos_token_id": None,
}
# Two families that differ where placement looks: Llama (grouped key/value heads, separate q, k,
# v; `model.layers`, `norm`, `lm_head`) and GPT-NeoX (fused query_key_value with biases,
# LayerNorm, `gpt_neox.layers`, `final_layer_norm`, `embed_out`).
FAMILIES = {"llama": {"num_key_value_heads": 2}, "gpt_neox": {}}


def write_config(folder: Path, family: str, **sizes: Any) -> Path:
    """`folder/config.json` of a tiny model of `family`, written by transformers itself."""
    import transformers

    values = {**TINY, **FAMILIES.get(family, {}), **sizes}
    transformers.AutoConfig.for_model(family, **values).save_pretrained(str(folder))
    return folder


def own_generate_tokens(
    model: str, seed: int, batch: int, prompt_length: int, new_tokens: int, device: str = "cpu"
) -> tuple[tuple[int, ...], ...]:
    """The new tokens of the model's own greedy `generate` in this process (static cache), on
    the prompt and weights a rank draws from the seed."""
    import torch
    from distperf_model.generate import make_prompt

    from pytest_distperf.ranks.hf import build_hf

    module, _ = build_hf(model, "", seed, torch.device(device), torch.float32)
    prompt = make_prompt(module.config, batch, prompt_length, seed, device)
    with torch.no_grad():
        out = module.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            do_sample=False,
            cache_implementation="static",
            disable_compile=True,  # on a GPU transformers would compile it: eager is the truth
        )
    return tuple(tuple(row) for row in out[:, prompt_length:].tolist())
