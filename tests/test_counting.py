"""The counted generation (ranks/counting.py): collectives, ops and FLOPs per token, counted
exactly, in-process on a one-process group (or a fake one of two ranks for FSDP2, whose gather
a group of one skips); then one session of real ranks whose JSON report carries `work`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distperf_model.config import Config
from distperf_model.generate import decode_one_token, make_prompt, prefill
from distperf_model.model import build_model
from helpers import Session, run_session, write_files

from pytest_distperf.ranks import counting
from pytest_distperf.ranks.counting import COUNTED_DECODE_STEPS, count_work
from pytest_distperf.ranks.hostspeed import host_times
from pytest_distperf.ranks.timing import Fences, StepOverride, run_workload
from pytest_distperf.work import CollectiveCount

TINY = Config.from_name("tiny")
FP32 = 4
CPU = torch.device("cpu")


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A gloo group of this process alone: plain collectives run and are dispatched."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def two_fake_ranks() -> Iterator[Any]:
    """A fake group of two ranks (torch's own FSDP tests count with it): collectives are
    dispatched with their real sizes and return at once; the mesh to shard over."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield init_device_mesh("cpu", (2,))
    dist.destroy_process_group()


def tiny(config: Config = TINY, tokens: int = 8) -> tuple[torch.nn.Module, torch.Tensor]:
    model = build_model(config, seed=1)
    model.setup_caches(1, 8 + tokens, device=CPU, dtype=torch.float32)
    return model, make_prompt(config, 1, 8, 1, CPU)


def all_reduce_after_each_block(model: torch.nn.Module) -> None:
    """The issue's regression: a 64-byte all_reduce added to every block."""

    def hook(module: Any, args: Any, output: Any) -> None:
        dist.all_reduce(torch.zeros(16))  # 16 x fp32 = 64 B

    for block in model.transformer.h:
        block.register_forward_hook(hook)


def test_a_plain_all_reduce_per_block_is_counted_per_token(one_rank: None) -> None:
    model, prompt = tiny()
    before = count_work(model, prompt, 8).work
    assert before.decode.collectives == {} and before.prefill.collectives == {}
    all_reduce_after_each_block(model)
    after = count_work(model, prompt, 8).work
    per_token = CollectiveCount(calls=TINY.n_layer, bytes=64 * TINY.n_layer)
    assert after.decode.collectives == {"all_reduce": per_token}
    assert after.prefill.collectives == {"all_reduce": per_token}
    assert (after.decode.kernels, after.graph_breaks, after.recompiles) == (None, None, None)
    assert after.decode.flops == before.decode.flops > 0


def test_fsdp2_gathers_every_parameter_per_token_unless_kept(two_fake_ranks: Any) -> None:
    from distperf_model.parallelize import fully_shard_blocks

    resharded, prompt = tiny()
    fully_shard_blocks(resharded, two_fake_ranks, reshard_after_forward=True)
    kept, _ = tiny()
    fully_shard_blocks(kept, two_fake_ranks, reshard_after_forward=False)
    count_work(kept, prompt, 8)  # the cold generation gathers once; the counted one is warm
    # Every block's unit and the root's (embedding, final norm, head): all of the weights.
    every_weight = CollectiveCount(calls=TINY.n_layer + 1, bytes=TINY.param_count() * FP32)
    work = count_work(resharded, prompt, 8).work
    assert work.decode.collectives == {"all_gather": every_weight}
    assert work.prefill.collectives == {"all_gather": every_weight}
    assert count_work(kept, prompt, 8).work.decode.collectives == {}


def test_the_same_generation_counts_the_same_twice(one_rank: None) -> None:
    model, prompt = tiny()
    all_reduce_after_each_block(model)
    first, second = (count_work(model, prompt, 8).work for _ in range(2))
    assert first == second
    assert first.decode.ops > 0 and first.prefill.flops > first.decode.flops


def test_more_compute_counts_more_ops_and_flops(one_rank: None) -> None:
    small = count_work(*tiny(), 8).work
    deeper = count_work(*tiny(dataclasses.replace(TINY, n_layer=3)), 8).work
    assert deeper.decode.ops > small.decode.ops
    # The blocks' matrix products and attention scale with the blocks; the head stays.
    assert deeper.decode.flops > small.decode.flops


def test_only_a_few_decode_steps_are_counted_and_divided_by_their_number() -> None:
    model, prompt = tiny(tokens=32)
    steps: list[str] = []

    def decode(model: Any, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        steps.append("decode")
        return decode_one_token(model, token, pos)

    per_token = count_work(model, prompt, 32, steps=StepOverride(decode=decode)).work
    assert len(steps) == COUNTED_DECODE_STEPS
    assert per_token == count_work(model, prompt, 3).work  # two steps: the same per token


def test_a_users_loop_counts_as_one_prefill_and_a_share_per_token(one_rank: None) -> None:
    model, prompt = tiny()
    all_reduce_after_each_block(model)

    def own_loop(model: Any, prompt: torch.Tensor, new: int) -> torch.Tensor:
        token = prefill(model, prompt, torch.arange(prompt.shape[1]))
        tokens = [token]
        for i in range(new - 1):
            tokens.append(decode_one_token(model, tokens[-1], torch.tensor([8 + i])))
        return torch.cat(tokens, dim=1)

    work = count_work(model, prompt, 4, generate=own_loop).work
    # No split is known: the whole loop is the prefill, and a quarter of it each decode token.
    assert work.prefill.collectives == {"all_reduce": CollectiveCount(4 * 2, 4 * 2 * 64)}
    assert work.decode.collectives == {"all_reduce": CollectiveCount(2, 2 * 64)}
    assert work.decode.ops == work.prefill.ops / 4


def test_a_compiled_step_is_counted_as_compiled_and_stays_compiled() -> None:
    from torch._dynamo.utils import counters

    model, prompt = tiny()
    calls: list[int] = []

    def backend(graph: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            calls.append(1)
            return graph.forward(*args)

        return run

    torch._dynamo.reset()
    since = counting.dynamo_mark()
    step = torch.compile(decode_one_token, backend=backend, dynamic=False)
    with torch.no_grad():  # compiled before the count, on a token as the prefill leaves it
        step(model, prefill(model, prompt, torch.arange(8)), torch.tensor([8]))
    frames = counters["frames"]["total"]
    work = count_work(model, prompt, 4, steps=StepOverride(decode=step), compiled_since=since).work
    assert len(calls) == 1 + 3  # the three counted decode steps ran the compiled graph
    assert (work.graph_breaks, work.recompiles) == (0, 0)
    assert counters["frames"]["total"] == frames
    with torch.no_grad():
        step(model, prompt[:, -1:], torch.tensor([9]))
    assert len(calls) == 5  # and it is still compiled after the count
    torch._dynamo.reset()


def test_a_failed_count_raises_after_the_generation_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    model, prompt = tiny()

    def broken(*args: Any, **kwargs: Any) -> int:
        raise ValueError("no formula")

    info = counting._Op(None, broken)
    monkeypatch.setattr(counting, "_op", lambda func: info)
    steps: list[torch.Tensor] = []

    def decode(model: Any, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        steps.append(token)
        return decode_one_token(model, token, pos)

    with pytest.raises(RuntimeError, match="counting the work failed at .*no formula"):
        count_work(model, prompt, 4, steps=StepOverride(decode=decode))
    assert len(steps) == 3  # every step ran: no other rank is left waiting in a collective


# Every collective op torch has, by the kind the work gate names it.
KINDS = {
    "all_gather": "c10d::_allgather_base_ c10d::allgather_ c10d::allgather_coalesced_ "
    "c10d::allgather_into_tensor_coalesced_ _c10d_functional::all_gather_into_tensor "
    "_c10d_functional::all_gather_into_tensor_out c10d_functional::all_gather_into_tensor "
    "_c10d_functional::all_gather_into_tensor_coalesced",
    "reduce_scatter": "c10d::_reduce_scatter_base_ c10d::reduce_scatter_ "
    "c10d::reduce_scatter_tensor_coalesced_ _c10d_functional::reduce_scatter_tensor "
    "_c10d_functional::reduce_scatter_tensor_out _c10d_functional::reduce_scatter_tensor_coalesced",
    "all_reduce": "c10d::allreduce_ c10d::allreduce_coalesced_ _c10d_functional::all_reduce "
    "_c10d_functional::all_reduce_ _c10d_functional::all_reduce_coalesced "
    "_c10d_functional::all_reduce_coalesced_",
    "broadcast": "c10d::broadcast_ _c10d_functional::broadcast _c10d_functional::broadcast_",
    "all_to_all": "c10d::alltoall_ c10d::alltoall_base_ _c10d_functional::all_to_all_single "
    "_dtensor::shard_dim_alltoall",
    "send": "c10d::send _c10d_functional::isend",
    "recv": "c10d::recv_ c10d::recv_any_source_ _c10d_functional::irecv",
    "reduce": "c10d::reduce_",
    "gather": "c10d::gather_",
    "scatter": "c10d::scatter_",
    "barrier": "c10d::barrier c10d::monitored_barrier_",
}


def test_every_collective_op_is_counted_under_its_kind() -> None:
    for kind, names in KINDS.items():
        for name in names.split():
            assert counting.collective_kind(name) == kind, name
    assert counting.collective_kind("c10d::batch_p2p_ops") == "batch_p2p_ops"  # its own name
    assert counting.collective_kind("aten::mm") is None
    assert counting.collective_kind("_dtensor::mesh_get_process_group") is None


def test_kernels_are_the_traces_kernel_events_and_their_time() -> None:
    def event(category: str, dur: float) -> dict[str, Any]:
        return {"cat": category, "name": "x", "ts": 1.0, "dur": dur, "args": {"correlation": 1}}

    events = [
        event("kernel", 4.0),
        *(event("kernel", 1.0) for _ in range(3)),  # a graph replay's kernels each count
        event("gpu_memcpy", 7.0),
        event("gpu_memset", 2.0),
        event("cuda_runtime", 30.0),
    ]
    profiled = counting.device_totals(events)
    assert (profiled.kernels, profiled.seconds) == (4, pytest.approx(7e-6))


def test_the_phase_skips_when_off_and_goes_on_without_a_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pytest_distperf.ranks import phases

    model, prompt = tiny()
    ctx = SimpleNamespace(
        spec=SimpleNamespace(count_work=False),
        wrapped=model,
        prompt=prompt,
        workload=SimpleNamespace(max_new_tokens=4),
        generate=None,
        half=SimpleNamespace(next_token=None),
        wrapped_steps=None,
        dynamo_before=None,
        fabric=SimpleNamespace(global_rank=1),
        counted=None,
    )
    phases.count_work(ctx)  # type: ignore[arg-type]
    assert ctx.counted is None
    ctx.spec.count_work = True
    phases.count_work(ctx)  # type: ignore[arg-type]
    assert ctx.counted is not None and ctx.counted.work.decode.ops > 0
    ctx.counted, ctx.wrapped = None, lambda idx, pos: 1 / 0
    phases.count_work(ctx)  # type: ignore[arg-type]
    assert ctx.counted is None
    assert "distperf: rank 1: counting the work failed" in capsys.readouterr().err


def test_cpu_time_is_the_timed_repeats_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock of the process's CPU, wait and steal that only the generations and what runs
    beside them advance: the figure holds the timed generations' share alone."""
    from pytest_distperf.ranks import timing

    model, prompt = tiny()
    fences = Fences(sync=lambda: None, barrier=lambda: None)
    clock = [0.0]
    monkeypatch.setattr(timing, "host_times", lambda: (clock[0], 2 * clock[0], 3 * clock[0]))

    def generate(model: Any, prompt: torch.Tensor, new: int) -> torch.Tensor:
        clock[0] += 1.0
        return torch.zeros(prompt.shape[0], new, dtype=torch.long)

    def busy_beside() -> None:  # the bare model and host loop run beside, outside the figure
        clock[0] += 100.0

    runs = run_workload(model, prompt, 4, 1, 2, fences, paired=busy_beside, generate=generate)
    assert runs[-1] == timing.HostTime(2.0, 4.0, 6.0)  # the two timed generations, not warm-up


def test_warm_up_warms_and_only_timed_repeats_are_paired() -> None:
    """What runs beside a timed repeat (the host loop, the bare model) is not run beside the
    warm-up, where only the bare model needs warming."""
    model, prompt = tiny()
    fences = Fences(sync=lambda: None, barrier=lambda: None)
    calls: list[str] = []
    _, _, _, beside, _ = run_workload(
        model,
        prompt,
        2,
        2,
        3,
        fences,
        paired=lambda: calls.append("paired") or len(calls),
        warmed=lambda: calls.append("warmed"),
    )
    assert calls == ["warmed", "warmed", "paired", "paired", "paired"]
    assert beside == [3, 4, 5]


def test_a_sharded_copy_is_expected_to_fit_where_memory_allows(monkeypatch) -> None:
    """On a device with an allocator, the whole copy built after wrapping must leave as much
    again free (ranks/bare.py): where it will not, the model is timed before wrapping."""
    from pytest_distperf.ranks import phases

    module = torch.nn.Linear(100, 100)  # 40,400 bytes
    model_bytes = 40_400
    ctx = SimpleNamespace(
        platform=SimpleNamespace(allocator_memory=True),
        model=SimpleNamespace(module=module),
        spec=SimpleNamespace(devices=2),
        device=CPU,
    )
    # After wrapping half the model is free again: 2.5 models needed in all.
    for free, fits in ((2.0 * model_bytes, True), (1.9 * model_bytes, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, f=free: (int(f), 0))
        assert phases._copy_fits(ctx) is fits  # type: ignore[arg-type]
    ctx.platform = SimpleNamespace(allocator_memory=False)  # an RSS heap: nothing runs out
    assert phases._copy_fits(ctx)  # type: ignore[arg-type]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux run-queue figures")
def test_run_queue_wait_is_what_a_neighbour_on_the_same_core_took() -> None:
    """A process spinning on this process's only core makes it wait runnable for about half of
    a stretch of its own busy work; alone on its core, it barely waits."""
    saved = os.sched_getaffinity(0)
    core = min(saved)
    os.sched_setaffinity(0, {core})
    try:
        alone = _waited_while_busy(0.3)
        spinner = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass",
            ]
        )
        try:
            time.sleep(0.2)  # the spinner is running before the stretch starts
            shared = _waited_while_busy(0.3)
        finally:
            spinner.kill()
            spinner.wait()
    finally:
        os.sched_setaffinity(0, saved)
    # other processes of this machine may share the core too: the spinner's part is the test
    assert shared > 0.1 and shared > alone + 0.05, (alone, shared)


def _waited_while_busy(cpu_seconds: float) -> float:
    before = host_times()
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass
    after = host_times()
    assert before[1] is not None and after[1] is not None
    return after[1] - before[1]


# --------------------------------------------------------------------------- real ranks

WORK = """
import pytest

# The counts, not the gates: they are off. Two tests of the same workload: the same work.
@pytest.mark.strategy("auto", "fsdp", "tp", "pipeline")
@pytest.mark.distperf(model="tiny", max_new_tokens=6, gates=False)
def test_first(distperf):
    distperf.run()

@pytest.mark.strategy("auto", "fsdp", "tp", "pipeline")
@pytest.mark.distperf(model="tiny", max_new_tokens=6, gates=False)
def test_second(distperf):
    distperf.run()
"""


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory, shared_pool: str) -> Session:
    path = tmp_path_factory.mktemp("work")
    write_files(path, test_work=WORK)
    args = ("--distperf-devices=2", "--distperf-repeats=2", "--distperf-json=report.json")
    return run_session(path, *args, pool=shared_pool)


@pytest.mark.slow
def test_every_strategy_reports_the_work_it_does_per_token(counted: Session) -> None:
    counted.assert_outcomes(passed=8)
    rows = counted.rows()
    work = {s: rows[f"test_first[{s}-2cpu]"]["work"] for s in ("auto", "fsdp", "tp", "pipeline")}
    assert work["auto"]["decode"]["collectives"] == {}
    # fsdp on CPU is FSDP2 resharding after every forward: each token gathers every weight.
    gather = work["fsdp"]["decode"]["collectives"]["all_gather"]
    assert gather["calls"] == TINY.n_layer + 1
    assert gather["bytes"] == pytest.approx(TINY.param_count() * FP32, rel=0.01)
    # tp sums each block's two row-wise outputs ([1, 1, n_embd]); the head stays whole.
    activation = TINY.n_embd * FP32
    assert work["tp"]["decode"]["collectives"] == {
        "all_reduce": {"calls": 2 * TINY.n_layer, "bytes": 2 * TINY.n_layer * activation}
    }
    # pipeline: the busiest rank sends and receives one activation per token (the token back
    # to the first stage is smaller).
    assert work["pipeline"]["decode"]["collectives"] == {
        "send": {"calls": 1, "bytes": activation},
        "recv": {"calls": 1, "bytes": activation},
    }
    assert all(w["decode"]["ops"] > 0 and w["decode"]["flops"] > 0 for w in work.values())
    assert all(w["decode"]["kernels"] is None for w in work.values())


@pytest.mark.slow
def test_an_unchanged_run_counts_the_same_work(counted: Session) -> None:
    rows = counted.rows()
    for strategy in ("auto", "fsdp", "tp", "pipeline"):
        first, second = (rows[f"{t}[{strategy}-2cpu]"] for t in ("test_first", "test_second"))
        assert first["work"] == second["work"], strategy
        assert first["host_cpu_per_token_s"] > 0
        assert first["device_time_per_token_s"] is None
