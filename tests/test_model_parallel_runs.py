"""tp and pipeline on real CPU ranks (gloo): a slow-down of their communication alone fails
their threshold while `auto` passes, a marker's own tp_plan is what runs, and the built-in
by-hand split gives one process's logits on real gloo ranks for LitGPT's GPT, the reference GPT
(row-wise biases) and grouped-query attention. LitGPT's tokens under tp and pipeline: see
test_litgpt.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import socket
import time
import traceback
from typing import Any

import pytest
import torch
from tp_logits import greedy_logits

pytestmark = pytest.mark.slow

# pythia-14m, whose head sets most of its compute: tiny's rate is set by per-call overheads and
# by waits for the other rank on two shared cores, which the prediction does not model. Healthy
# tp on busy shared CI cores fell to 0.23 of its prediction, hence the loose efficiency 0.1; a
# sleep of 150 ms in each all-reduce or send puts both below a third of that (pipeline, with
# two sends a token, until its measured step passes 30 ms).
TEST_COMM = """
import pytest

@pytest.mark.strategy("auto", "tp", "pipeline")
@pytest.mark.distperf(model="pythia-14m", max_new_tokens=4, efficiency=0.1, comm_delay={delay})
def test_rate(distperf):
    distperf.run()

@pytest.mark.strategy("tp")
@pytest.mark.distperf(
    model="pythia-14m", max_new_tokens=4, efficiency=0.01, tp_plan="plans:mlp_only"
)
def test_own_plan(distperf):
    distperf.run()
"""

PLANS = """
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def mlp_only(model, tp_mesh):
    for block in model.transformer.h:
        parallelize_module(block.mlp, tp_mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})
    return model
"""


def test_a_communication_slowdown_fails_tp_and_pipeline_but_not_auto(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(plans=PLANS, test_comm=TEST_COMM.format(delay=0.0))
    report = pytester.path / "distperf.json"
    healthy = pytester.runpytest_subprocess("--distperf-devices=2", f"--distperf-json={report}")
    healthy.assert_outcomes(passed=4)
    rows = json.loads(report.read_text())["results"]
    sharding = {row["test_id"].split("::")[-1]: row["implementation"]["sharding"] for row in rows}
    assert sharding == {
        "test_rate[auto-2cpu]": "replicated",
        "test_rate[tp-2cpu]": "TP 2-way: 12 column-wise, 12 row-wise linears",
        "test_rate[pipeline-2cpu]": "pipeline 2 stages of 3+3 blocks (send/recv)",
        # the marker's plan split only the MLPs, with DTensor
        "test_own_plan[tp-2cpu]": "TP 2-way DTensor: 6 column-wise, 6 row-wise linears",
    }

    pytester.makepyfile(test_comm=TEST_COMM.format(delay=0.15))
    # one repeat, no warm-up (which could only make it slower): tp sleeps through 2 x 6
    # all-reduces a token
    slowed = pytester.runpytest_subprocess(
        "--distperf-devices=2", "--distperf-repeats=1", "--distperf-warmup=0", "-k", "test_rate"
    )
    slowed.assert_outcomes(passed=1, failed=2, deselected=1)
    slowed.stdout.fnmatch_lines(
        [
            "*FAILED*test_rate[[]tp-2cpu[]]*",
            "*FAILED*test_rate[[]pipeline-2cpu[]]*",
        ],
        consecutive=False,
    )
    slowed.stdout.fnmatch_lines(
        [
            "*tp (TP 2-way (by hand)) on 2 device(s): measured * tok/s is below the threshold*",
            "*terms: compute *, all_reduce *, latency *",
        ]
    )
    slowed.stdout.fnmatch_lines(
        [
            "*pipeline (pipeline 2 stages (send/recv)) on 2 device(s): measured * tok/s is below*",
            "*terms: compute *, p2p *, latency *",
        ]
    )
    assert "test_rate[auto-2cpu] FAILED" not in slowed.stdout.str()


# --------------------------------------------------------------------------- the plan itself

WORLD = 2


def _models() -> dict[str, Any]:
    """name -> builder of the same weights in every process."""
    from distperf_model.config import Config
    from distperf_model.model import build_model

    models: dict[str, Any] = {
        "gqa-llama": lambda: build_model(Config.from_name("tiny-llama"), seed=3),
        "tiny": lambda: build_model(Config.from_name("tiny"), seed=3),  # row-wise biases
    }
    try:
        from litgpt import GPT
        from litgpt import Config as LitConfig
    except ImportError:
        return models

    def litgpt_pythia() -> Any:
        torch.manual_seed(3)
        return GPT(LitConfig.from_name("pythia-14m")).eval()

    models["litgpt-pythia-14m"] = litgpt_pythia
    return models


def _logits(name: str, model: Any) -> list[torch.Tensor]:
    return greedy_logits(model)


def _rank(rank: int, port: int, results: Any) -> None:
    import torch.distributed as dist
    from distperf_model.parallelize import tensor_parallel
    from torch.distributed.device_mesh import init_device_mesh

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        names = ("data_parallel", "tensor_parallel")  # as Fabric's ModelParallelStrategy has it
        mesh = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=names)
        got = {}
        for name, make in _models().items():
            model = tensor_parallel(make(), mesh)
            got[name] = [t.numpy() for t in _logits(name, model)]
        dist.destroy_process_group()
        results.put((rank, got, None))
    except BaseException:  # noqa: BLE001 - report anything to the parent instead of hanging it
        results.put((rank, None, traceback.format_exc()))
    time.sleep(1)  # let the parent read the queue before this process goes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensor_parallel_gives_one_process_logits() -> None:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        while len(got) < WORLD:
            try:
                rank, logits, error = results.get(timeout=120)
            except queue.Empty:
                pytest.fail(f"ranks did not answer in 120 s (got {sorted(got)})")
            if error is not None:
                pytest.fail(f"rank {rank} failed:\n{error}")
            got[rank] = logits
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    models = _models()
    for name, make in models.items():
        expected = _logits(name, make())
        for rank in range(WORLD):
            for step, (ours, theirs) in enumerate(zip(got[rank][name], expected, strict=True)):
                torch.testing.assert_close(
                    torch.from_numpy(ours), theirs, atol=1e-5, rtol=1e-4, msg=f"{name} {step}"
                )
    if "litgpt-pythia-14m" not in models:
        pytest.skip("LitGPT's GPT not checked: pip install 'pytest-distperf[litgpt]'")
