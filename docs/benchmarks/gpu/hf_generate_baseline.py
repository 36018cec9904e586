"""The same HF model's own `generate`, timed outside the plugin: greedy, a static cache, the
plugin's prompt (same seed, same length) and weights (ranks/hf.py's build), batch 1.

    python3 docs/benchmarks/gpu/hf_generate_baseline.py --out-dir $OUT   # hf-eager.json,
                                                                         # hf-compiled.json

tok/s as the plugin's `tokens_per_sec`: new tokens over one generation's wall time, prefill
included, median of the repeats (each fenced by a device sync). Without --eager, transformers
compiles the decode step itself (its auto-compile of a static cache's forward): eager first, then
compiled, one build for both; each mode's file is written as soon as it is timed.

`--wrap fsdp|fsdp-noreshard` first wraps the model as the plugin's strategy of that name does on
one rank (its own rank half and Fabric), so that HF's loop pays the same per-layer hooks as the
plugin's: `generate` runs on the wrapped HF model (FSDP2: the model itself, hooks on its root and
layers; FSDP1: the root unit's inner module, so the root unit's own hooks are skipped). Files:
hf-<wrap>-<mode>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from distperf_model.generate import make_prompt

from pytest_distperf.ranks.hf import build_hf

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(HERE / "hf_llama_1b.json"))
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)  # compiled: trace, compile, graphs
    parser.add_argument("--seed", type=int, default=1234)  # Workload's default seed
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--device", default="cuda")  # "cpu": a smoke test of this script
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--wrap", default="auto", choices=("auto", "fsdp", "fsdp-noreshard"))
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    began = time.perf_counter()
    model, startup = build_hf(f"hf:{args.config}", "", args.seed, device, torch.bfloat16)
    built_s = time.perf_counter() - began
    prompt = make_prompt(model.config, 1, args.prompt_length, args.seed, device)
    if args.wrap != "auto":
        model = wrapped_as_plugin(model, args.wrap, device)
    for mode in args.modes.split(","):
        row = timed(model, prompt, args, eager=mode == "eager")
        row.update(build_s=built_s, import_s=startup.import_s, device=_device_name(device))
        row.update(wrap=args.wrap, wrapper=type(model).__name__)
        name = f"hf-{mode}.json" if args.wrap == "auto" else f"hf-{args.wrap}-{mode}.json"
        Path(args.out_dir, name).write_text(json.dumps(row, indent=2) + "\n")
        print(json.dumps({k: row[k] for k in ("what", "tokens_per_sec", "first_call_s")}))


def wrapped_as_plugin(model: torch.nn.Module, strategy: str, device: torch.device) -> Any:
    """`model` wrapped by the plugin's rank half of `strategy` on one rank, through Fabric: the
    HF model whose `generate` then runs through the wrapper's hooks."""
    import os

    from pytest_distperf.platform import platform_of
    from pytest_distperf.ranks.environment import join_group
    from pytest_distperf.ranks.fabric import fabric_module
    from pytest_distperf.ranks.hf import decoder_layers
    from pytest_distperf.ranks.strategies import BuildContext, rank_strategy

    for name, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29511"),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
    ):
        os.environ.setdefault(name, value)
    join_group(device)
    context = BuildContext(platform_of(device.type), 1, wrap_units=decoder_layers(model))
    fabric = fabric_module().Fabric(
        accelerator=device.type,
        devices=1,
        strategy=rank_strategy(strategy).build(context),
        precision="bf16-true",
    )
    fabric.launch()
    wrapped = fabric.setup_module(model).module  # FSDP2: the model; FSDP1: its root unit
    return getattr(wrapped, "module", wrapped)  # FSDP1's inner module: the HF model again


def timed(model: torch.nn.Module, prompt: torch.Tensor, args: Any, eager: bool) -> dict[str, Any]:
    """The model's own generate, `args.warmup` untimed calls then `args.repeats` timed ones."""
    import transformers

    sync = torch.cuda.synchronize if prompt.device.type == "cuda" else lambda: None
    options = dict(
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
        cache_implementation="static",
        disable_compile=eager,
    )
    times: list[float] = []
    first = 0.0
    with torch.no_grad():
        for i in range(args.warmup + args.repeats):
            sync()
            start = time.perf_counter()
            out = model.generate(prompt, **options)
            sync()
            if i == 0:
                first = time.perf_counter() - start
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
    new = out.shape[1] - args.prompt_length
    return {
        "what": "model.generate, greedy, static cache" + (", eager" if eager else ", compiled"),
        "compiled": not eager,
        "tokens_per_sec": new / statistics.median(times),
        "tokens_per_sec_samples": [new / t for t in times],
        "new_tokens": new,
        "prompt_length": args.prompt_length,
        "first_call_s": first,
        "parameters": sum(p.numel() for p in model.parameters()),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


if __name__ == "__main__":
    main()
