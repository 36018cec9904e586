"""Where does a GPU host's eager-decode speed wander? A diagnostic, not part of the plugin.

For `--seconds`, alternately times (1) a fixed piece of pure-Python work (host speed alone),
(2) one generation of `--tokens` tokens through the bare model (launch-bound eager decode) and
(3) a large matmul timed with CUDA events (device speed alone), and records beside each: the CPU
the main thread ran on, the host's steal time, involuntary context switches and the GPU's SM
clock. One JSON line per round goes to `--out`.

    python3 docs/benchmarks/host_noise_probe.py --gpu 0 --seconds 40 --out probe.jsonl
    taskset -c 3 python3 docs/benchmarks/host_noise_probe.py --gpu 1 ...   # pinned
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch
from distperf_model import Config, build_model
from distperf_model.generate import decode_one_token, make_prompt, prefill

from pytest_distperf.ranks.hostspeed import interpreter_loop_seconds as python_work


def current_cpu() -> int:
    # Field 39 of /proc/thread-self/stat: the CPU this thread last ran on.
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def steal_ticks() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--model", default="pythia-2.8b")
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    config = Config.from_name(args.model)
    model = build_model(config, seed=1234, device=device, dtype=torch.bfloat16)
    model.setup_caches(1, 8 + args.tokens, device=device, dtype=torch.bfloat16)
    prompt = make_prompt(config, 1, 8, 1234, device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    @torch.no_grad()
    def generation() -> float:
        torch.cuda.synchronize(device)
        token = prefill(model, prompt, torch.arange(8, device=device))
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        pos = torch.tensor([8], device=device)
        for _ in range(args.tokens - 1):
            token = decode_one_token(model, token, pos)
            pos = pos + 1
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / (args.tokens - 1)

    def matmul() -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(10):
            a @ a
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 10 / 1e3

    generation()  # warm-up
    matmul()
    origin = time.perf_counter()
    with open(args.out, "w") as out:
        while time.perf_counter() - origin < args.seconds:
            steal, switches = steal_ticks(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
            row = {
                "t": round(time.perf_counter() - origin, 3),
                "gpu": args.gpu,
                "affinity": sorted(os.sched_getaffinity(0)),
                "cpu_before": current_cpu(),
                "python_s": python_work(),
                "token_s": generation(),
                "matmul_s": matmul(),
                "cpu_after": current_cpu(),
                "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "steal_ticks": steal_ticks() - steal,
                "involuntary_switches": resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
                - switches,
            }
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
