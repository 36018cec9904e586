"""Where one compiled decode step's time goes on one GPU: matrix products, other kernels, gaps.

The plugin's own compiled step (`compile_bare_step`, CUDA graphs) on a reference preset with
random weights, timed with CUDA events, then profiled with torch.profiler; kernels are split
into matrix products (which read the weights) and the rest. Tells whether the distance to the
copy bandwidth is the products' own speed or the many small kernels around them.

    python3 docs/benchmarks/gpu/decode_profile.py --preset llama-2-7b --json out.json
    python3 docs/benchmarks/gpu/decode_profile.py --coordinate-descent   # inductor tuning on
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from distperf_model import PRESETS, build_model, make_prompt
from torch.profiler import ProfilerActivity, profile

from pytest_distperf.ranks.compiled import compile_bare_step, settle

# cuBLAS / CUTLASS / Triton template names of a matrix product kernel
MATMUL_MARKS = ("gemm", "gemv", "cutlass", "nvjet", "xmma", "splitk", "triton_tem_fused_mm")


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Read + write bytes per second of a device copy, as the plugin's calibration counts it
    (ranks/calibrate.py needs a process group; this script runs without one)."""
    src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(iters + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-2-7b", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--coordinate-descent", action="store_true")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    if args.coordinate_descent:
        torch._inductor.config.coordinate_descent_tuning = True

    device = torch.device("cuda")
    model = build_model(PRESETS[args.preset], seed=0, device=device, dtype=torch.bfloat16)
    prompt = make_prompt(model.config, 1, 8, seed=0, device=device)
    # positions wrap within one generation's length: the attention reads as short a cache as
    # the plugin's own runs do
    model.setup_caches(1, 8 + args.steps)
    compiled = compile_bare_step(model, device, with_prefill=False)
    compile_s = settle(compiled, model, prompt, torch.cuda.synchronize)
    weight_bytes = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if "wte" not in n
    )
    token = prompt[:, -1:]
    positions = [torch.tensor([8 + i], device=device) for i in range(args.steps)]

    def steps(count: int) -> None:
        nonlocal token
        for i in range(count):
            token = compiled.step(model, token, positions[i % args.steps])

    step_ms = []
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        steps(args.steps)
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - start) * 1e3 / args.steps)

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps(args.steps)
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", 0)
        if device_us > 0 and event.key not in ("cudaGraphLaunch",):
            kernels[event.key] = kernels.get(event.key, 0.0) + device_us / args.steps
    matmul_us = sum(t for k, t in kernels.items() if any(m in k.lower() for m in MATMUL_MARKS))
    total_us = sum(kernels.values())
    step = statistics.median(step_ms)
    bandwidth = copy_bandwidth()
    figures = {
        "preset": args.preset,
        "coordinate_descent": args.coordinate_descent,
        "how": compiled.how,
        "compile_s": round(compile_s, 1),
        "step_ms_median": round(step, 4),
        "step_ms_repeats": [round(t, 4) for t in step_ms],
        "tokens_per_sec": round(1e3 / step, 2),
        "weight_bytes_read": weight_bytes,
        "copy_bandwidth_TBps": round(bandwidth / 1e12, 3),
        "share_of_copy_bandwidth": round(weight_bytes / (step / 1e3) / bandwidth, 4),
        "kernel_ms_per_step": round(total_us / 1e3, 4),
        "matmul_ms_per_step": round(matmul_us / 1e3, 4),
        "other_kernels_ms_per_step": round((total_us - matmul_us) / 1e3, 4),
        "idle_ms_per_step": round(step - total_us / 1e3, 4),
        "matmul_share_of_copy_bandwidth": round(
            weight_bytes / (matmul_us / 1e6) / bandwidth if matmul_us else 0.0, 4
        ),
        "kernel_launches_per_step": round(
            sum(e.count for e in prof.key_averages() if e.key in kernels) / args.steps, 1
        ),
        "top_kernels_us_per_step": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12]),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
