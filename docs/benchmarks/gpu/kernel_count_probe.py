"""CUDA probe: kernels per decode token (eager, manual CUDA graph, torch.compile default and
reduce-overhead), summed kernel time, dynamo graph breaks / recompiles, NCCL kernels.

Run on a GPU machine (written for torch 2.11+, needs nothing but torch):
    python kernel_count_probe.py        # every variant, each in its own subprocess; one JSON line
    python kernel_count_probe.py --variant eager   # one variant, JSON line
Variants: eager, graph (torch.cuda.graph captured before any profiler use), graph_cupti_init
(torch.profiler._utils._init_for_cuda_graphs() before capture: the documented workaround;
third-party reports say it can *kill* later kernel collection, so both are probed),
compile_default, compile_ro (mode="reduce-overhead", cudagraph trees), nccl (2 GPUs only).
Per token: the kernels launched inside record_function("tok<i>") windows, attributed through
the trace's correlation ids (kernel -> cudaLaunchKernel/cuLaunchKernel/cudaGraphLaunch ->
annotation window), so graph replays count their kernels if CUPTI reports them.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch._dynamo  # noqa: F401  (module-level: a local import would shadow `torch`)
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT, TOKENS, MAXLEN = 8, 8, 64
DEV = os.environ.get("PROBE_DEVICE", "cuda")  # PROBE_DEVICE=cpu: self-test of the code paths


if DEV == "cpu":
    torch.set_num_threads(1)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


class Block(nn.Module):
    def __init__(self, d, h, maxlen):
        super().__init__()
        self.h, self.hd = h, d // h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("k", torch.zeros(1, h, maxlen, self.hd), persistent=False)
        self.register_buffer("v", torch.zeros(1, h, maxlen, self.hd), persistent=False)

    def forward(self, x, pos, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.h, self.hd).transpose(1, 2) for t in (q, k, v))
        self.k.index_copy_(2, pos, k)  # static KV cache, in place: graph-capturable
        self.v.index_copy_(2, pos, v)
        y = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=1024, d=256, h=4, layers=4, maxlen=MAXLEN):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h, maxlen) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer(
            "causal", torch.tril(torch.ones(maxlen, maxlen, dtype=torch.bool)), persistent=False
        )

    def forward(self, idx, pos):
        mask = self.causal.index_select(0, pos).view(1, 1, pos.numel(), -1)
        x = self.wte(idx)
        for b in self.blocks:
            x = b(x, pos, mask)
        return self.head(self.ln_f(x))[:, -1].argmax(-1, keepdim=True)  # (1,1) next token


# ---------------------------------------------------------------- trace analysis
def analyze(trace_path, ntok):
    """Per tok<i> annotation: kernels, memcpy/memset, kernel time (sum and busy union)."""
    with open(trace_path) as f:
        ev = json.load(f)["traceEvents"]
    cats = {}
    for e in ev:
        cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
    wins = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in ev
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("tok")
    )
    launch_win, launch_name = {}, {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            c = e["args"]["correlation"]
            launch_name[c] = e["name"]
            for a, b, n in wins:
                if a <= e["ts"] <= b:
                    launch_win[c] = n
    per = {
        n: {"kernels": 0, "memcpy": 0, "memset": 0, "kernel_us": 0.0, "iv": [], "launch_apis": {}}
        for _, _, n in wins
    }
    unattributed = 0
    kernel_arg_keys = set()
    for e in ev:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        c = e.get("args", {}).get("correlation")
        w = launch_win.get(c)
        if cat == "kernel":
            kernel_arg_keys |= set(e.get("args", {}))
        if w is None:
            unattributed += 1
            continue
        p = per[w]
        if cat == "kernel":
            p["kernels"] += 1
            p["kernel_us"] += e["dur"]
            p["iv"].append((e["ts"], e["ts"] + e["dur"]))
            api = launch_name.get(c, "?")
            p["launch_apis"][api] = p["launch_apis"].get(api, 0) + 1
        else:
            p["memcpy" if cat == "gpu_memcpy" else "memset"] += 1
    rows = []
    for _, _, n in wins:
        p = per[n]
        busy, end = 0.0, -1.0
        for a, b in sorted(p.pop("iv")):
            if b > end:
                busy += b - max(a, end)
                end = b
        p["busy_us"] = round(busy, 2)
        p["kernel_us"] = round(p["kernel_us"], 2)
        rows.append({"tok": n, **p})
    api_calls = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and any(
            a <= e["ts"] <= b for a, b, _ in wins
        ):
            api_calls[e["name"]] = api_calls.get(e["name"], 0) + 1
    return {
        "per_token": rows,
        "unattributed_device_events": unattributed,
        "trace_cats": cats,
        "kernel_arg_keys": sorted(kernel_arg_keys),
        "runtime_calls_in_windows_per_token": {
            k: v / max(ntok, 1) for k, v in sorted(api_calls.items())
        },
    }


def summarize(an):
    ks = [r["kernels"] for r in an["per_token"]]
    us = [r["kernel_us"] for r in an["per_token"]]
    return {
        "kernels_per_token": sorted(set(ks)),
        "kernel_time_per_token_s_median": sorted(us)[len(us) // 2] * 1e-6 if us else None,
        "launch_apis": an["per_token"][0]["launch_apis"] if an["per_token"] else {},
    }


# ---------------------------------------------------------------- variants
def dynamo_snapshot():
    from torch._dynamo.utils import counters

    return {
        "frames_total": counters["frames"]["total"],
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
    }


def run_variant(variant):
    from torch.profiler import ProfilerActivity, profile, record_function

    dev = torch.device(DEV)
    res = {
        "variant": variant,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
    }
    if variant == "graph_cupti_init":
        from torch.profiler._utils import _init_for_cuda_graphs

        _init_for_cuda_graphs()
    torch.manual_seed(0)
    model = TinyGPT().to(dev).eval()
    prompt = torch.arange(1, PROMPT + 1, device=dev).view(1, -1)
    pos_pre = torch.arange(PROMPT, device=dev)
    s_idx = torch.zeros(1, 1, dtype=torch.long, device=dev)  # static decode inputs
    s_pos = torch.zeros(1, dtype=torch.long, device=dev)

    step = model
    if variant.startswith("compile"):
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        mode = "reduce-overhead" if variant == "compile_ro" else None
        step = torch.compile(model, mode=mode)

    graph = None
    if variant.startswith("graph"):
        with torch.no_grad():
            model(prompt, pos_pre)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(s_idx, s_pos)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                s_out = model(s_idx, s_pos)

    def decode(tok, p):
        if graph is not None:
            s_idx.copy_(tok)
            s_pos.fill_(p)
            graph.replay()
            return s_out.clone()
        if variant == "compile_ro" and DEV == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        s_idx.copy_(tok)
        s_pos.fill_(p)
        return step(s_idx, s_pos).clone()

    def generation(prof_tokens=False):
        with torch.no_grad():
            if variant == "compile_ro" and DEV == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            tok = (model if graph is not None else step)(prompt, pos_pre).clone()  # prefill
            times = []
            for i in range(TOKENS):
                sync()
                t0 = time.perf_counter()
                if prof_tokens:
                    with record_function(f"tok{i}"):
                        tok = decode(tok, PROMPT + i)
                else:
                    tok = decode(tok, PROMPT + i)
                sync()
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    t_c = time.perf_counter()
    for _ in range(3):  # warm-up (compiles, cudagraph-tree recording)
        generation()
    res["warmup_s"] = round(time.perf_counter() - t_c, 3)
    if variant.startswith("compile"):
        res["dynamo_after_warmup"] = dynamo_snapshot()
    res["wall_per_token_s_unprofiled"] = generation()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
        with profile(activities=acts) as prof:
            res["wall_per_token_s_profiled"] = generation(prof_tokens=True)
        prof.export_chrome_trace(path)
        an = analyze(path, TOKENS)
        # cross-check with the in-memory API: device events per tok window
        res["function_events_cuda"] = sum(
            1 for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")
        )
    res.update(summarize(an))
    res["analysis"] = an
    if variant.startswith("compile"):
        res["dynamo_after_measure"] = dynamo_snapshot()
        res["recompiles_during_measure"] = (
            res["dynamo_after_measure"]["frames_total"] - res["dynamo_after_warmup"]["frames_total"]
        )
        ex = torch._dynamo.explain(model)(s_idx, s_pos)
        res["explain_decode"] = {
            "graph_count": ex.graph_count,
            "graph_break_count": ex.graph_break_count,
            "break_reasons": [str(b.reason)[:160] for b in ex.break_reasons],
        }
    # WorkCounter (dispatch level) on CUDA eager: aten ops vs kernels per token
    if variant == "eager":
        try:
            sys.path.insert(0, HERE)
            from probe_work_counter import WorkCounter

            wc = WorkCounter()
            with torch.no_grad(), wc:
                tok = model(prompt, pos_pre)
                for i in range(3):
                    wc.step(f"decode:{i}")
                    tok = decode(tok, PROMPT + i)
            res["wc_aten_ops_per_token"] = sorted({s["aten_ops"] for s in wc.steps[1:]})
            res["wc_flops_per_token"] = sorted({int(s["flops"]) for s in wc.steps[1:]})
        except Exception as e:  # wc.py not copied alongside
            res["wc_error"] = repr(e)
    return res


def nccl_worker(rank, port, q):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    x = torch.ones(1 << 18, device="cuda")  # 1 MiB fp32
    out = torch.empty(2 << 18, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(4):
                with record_function(f"tok{i}"):
                    dist.all_reduce(x)
                    dist.all_gather_into_tensor(out, x)
            torch.cuda.synchronize()
        prof.export_chrome_trace(path)
        an = analyze(path, 4)
    r = {
        "rank": rank,
        **summarize(an),
        "per_token": an["per_token"][:2],
        "unattributed": an["unattributed_device_events"],
    }
    sys.path.insert(0, HERE)
    try:
        from probe_work_counter import WorkCounter

        wc = WorkCounter()
        with wc:
            wc.step("t")
            dist.all_reduce(x)
            dist.all_gather_into_tensor(out, x)
        r["wc_coll"] = {k: v for k, v in wc.steps[1]["coll"].items()}
    except Exception as e:
        r["wc_error"] = repr(e)
    q.put(r)
    dist.destroy_process_group()


def run_nccl():
    if torch.cuda.device_count() < 2:
        return {"variant": "nccl", "skipped": "needs 2 GPUs"}
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=nccl_worker, args=(r, port, q)) for r in range(2)]
    for p in ps:
        p.start()
    out = sorted((q.get(timeout=300) for _ in ps), key=lambda r: r["rank"])
    for p in ps:
        p.join()
    return {"variant": "nccl", "ranks": out}


VARIANTS = ["eager", "graph", "graph_cupti_init", "compile_default", "compile_ro", "nccl"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant")
    ap.add_argument(
        "--full", action="store_true", help="keep per-token analysis in the combined line"
    )
    a = ap.parse_args()
    if a.variant:
        try:
            r = run_nccl() if a.variant == "nccl" else run_variant(a.variant)
        except Exception as e:
            import traceback

            r = {"variant": a.variant, "error": repr(e), "tb": traceback.format_exc()[-1500:]}
        print("RESULT " + json.dumps(r, default=str))
        return
    if DEV == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA"}))
        return
    combined = {}
    for v in VARIANTS:  # each in a fresh process: profiler/CUPTI state is process-global
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--variant", v],
            capture_output=True,
            text=True,
            timeout=900,
        )
        line = [out for out in p.stdout.splitlines() if out.startswith("RESULT ")]
        r = json.loads(line[-1][7:]) if line else {"rc": p.returncode, "stderr": p.stderr[-1500:]}
        if not a.full and "analysis" in r:
            an = r.pop("analysis")
            r["per_token_first2"] = an["per_token"][:2]
            r["unattributed_device_events"] = an["unattributed_device_events"]
            r["runtime_calls_per_token"] = an["runtime_calls_in_windows_per_token"]
            r["kernel_arg_keys"] = an["kernel_arg_keys"]
        combined[v] = r
    print(json.dumps(combined, default=str))


if __name__ == "__main__":
    main()
