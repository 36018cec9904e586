"""Which host-device syncs torch.profiler's CUDA sync events record, by kind (issue 44 probe).

Runs a few small loops on one CUDA device, each with a known sync in it, under a CUDA-only
profiler session with `enable_cuda_sync_events`, and prints the trace's sync events by category
and name; saves the traces' sync and kernel events (no host ops) to $OUT for the test data.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

STEPS = 5
OUT = Path(os.environ.get("OUT", "."))


def model_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w) @ w.T


def loop(kind: str, x: torch.Tensor, w: torch.Tensor) -> None:
    side = torch.cuda.Stream()
    for _ in range(STEPS):
        y = model_step(x, w)
        if kind == "device_synchronize":
            torch.cuda.synchronize()
        elif kind == "item":
            y[0, 0].item()
        elif kind == "nonzero":
            torch.nonzero(y > 0)
        elif kind == "cpu_copy":
            y[:2].cpu()
        elif kind == "mask":
            y[y > 0].sum()
        elif kind == "event_synchronize":
            event = torch.cuda.Event()
            event.record()
            event.synchronize()
        elif kind == "stream_synchronize":
            torch.cuda.current_stream().synchronize()
        elif kind == "wait_stream":  # device-side wait: no host sync
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                y = y * 2
            torch.cuda.current_stream().wait_stream(side)


def traced(kind: str, x: torch.Tensor, w: torch.Tensor, cpu_too: bool) -> list[dict]:
    config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if cpu_too else [])
    session = profile(activities=activities, experimental_config=config)
    session.start()
    loop(kind, x, w)
    torch.cuda.synchronize()
    session.stop()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.json"
        session.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def main() -> None:
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), flush=True)
    x = torch.randn(64, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    kinds = [
        "none",
        "device_synchronize",
        "item",
        "nonzero",
        "cpu_copy",
        "mask",
        "event_synchronize",
        "stream_synchronize",
        "wait_stream",
    ]
    saved = {}
    for kind in kinds:
        loop(kind, x, w)  # warm
        for cpu_too in (False, True):
            events = traced(kind, x, w, cpu_too)
            cats = collections.Counter(
                (e.get("cat"), e.get("name"))
                for e in events
                if "sync" in str(e.get("cat", "")).lower()
                or "Sync" in str(e.get("name", ""))
                or "Wait" in str(e.get("name", ""))
            )
            print(f"{kind:20s} cpu={cpu_too} {STEPS} steps:", dict(cats), flush=True)
            if not cpu_too:
                keep = [
                    e
                    for e in events
                    if e.get("cat") in ("kernel", "cuda_sync", "gpu_memcpy")
                    or "sync" in str(e.get("cat", "")).lower()
                ]
                saved[kind] = keep
        example = [e for e in events if "sync" in str(e.get("cat", "")).lower()][:2]
        print("   example:", json.dumps(example)[:800], flush=True)
    (OUT / "sync_events.json").write_text(json.dumps(saved))
    # Cost: one profiled loop with and without sync events.
    for flag in (False, True):
        config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=flag)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA], experimental_config=config) as p:
                loop("item", x, w)
                torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as folder:
                p.export_chrome_trace(str(Path(folder) / "t.json"))
            times.append(time.perf_counter() - start)
        print(
            f"profiled loop with sync events={flag}: median {sorted(times)[2] * 1e3:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
