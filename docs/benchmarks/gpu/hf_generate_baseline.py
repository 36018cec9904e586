"""The same HF model's own `generate`, timed outside the plugin: greedy, a static cache, the
plugin's prompt (same seed, same length) and weights (ranks/hf.py's build), batch 1.

    python3 docs/benchmarks/gpu/hf_generate_baseline.py --eager --out hf-eager.json
    python3 docs/benchmarks/gpu/hf_generate_baseline.py --out hf-compiled.json

tok/s as the plugin's `tokens_per_sec`: new tokens over one generation's wall time, prefill
included, median of the repeats (each fenced by a device sync). Without --eager, transformers
compiles the decode step itself (its auto-compile of a static cache's forward).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

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
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--device", default="cuda")  # "cpu": a smoke test of this script
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    began = time.perf_counter()
    model, startup = build_hf(f"hf:{args.config}", "", args.seed, device, torch.bfloat16)
    built_s = time.perf_counter() - began
    prompt = make_prompt(model.config, 1, args.prompt_length, args.seed, device)
    options = dict(
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=False,
        cache_implementation="static",
        disable_compile=args.eager,
    )
    times, first = [], None
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
    median = statistics.median(times)
    import transformers

    row = {
        "what": "model.generate, greedy, static cache" + (" (eager)" if args.eager else ""),
        "compiled": not args.eager,
        "tokens_per_sec": new / median,
        "tokens_per_sec_samples": [new / t for t in times],
        "new_tokens": new,
        "prompt_length": args.prompt_length,
        "first_call_s": first,
        "build_s": built_s,
        "import_s": startup.import_s,
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    Path(args.out).write_text(json.dumps(row, indent=2) + "\n")
    print(json.dumps({k: row[k] for k in ("what", "tokens_per_sec", "new_tokens", "parameters")}))


if __name__ == "__main__":
    main()
