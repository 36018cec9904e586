"""The prediction from what the ranks measured of their own decode (ranks/local.py; CPU ranks
and one CUDA device): the measured share scales the compute, the in-step collectives replace
the calibrated ones, and a run without it keeps the byte-share model. Pure: made-up figures,
no ranks; last, where the ranks measure themselves, how many pairs they time and which steps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from distperf_model.config import PRESETS

from pytest_distperf.judge.gate import local_measure
from pytest_distperf.perfmodel import LocalMeasure, nominal_links
from pytest_distperf.spec import Implementation, RankResult, RunResult, RunSpec, Sample, Workload
from pytest_distperf.strategies import predict_for
from pytest_distperf.topology.host import probe_cpu

CPU = dict(device_type="cpu", dtype_bytes=4, max_new_tokens=12, compute_time_s=0.004)


def _links():  # type: ignore[no-untyped-def]
    return nominal_links(probe_cpu(2), 2)


def test_shares_and_waits_combine_by_how_the_ranks_run() -> None:
    m = LocalMeasure((1.2, 0.8), (1.0, 0.5), (0.010, 0.011), (0.004, 0.003))
    assert m.share(False) == 1.2 and m.share(True) == pytest.approx(2.0)
    assert m.prefill_share(True) == pytest.approx(1.5)
    assert m.path_wait_s(False) == pytest.approx(0.008)  # the most any rank's step grew
    assert m.path_wait_s(True) == pytest.approx(0.004)  # over every stage's compute
    assert LocalMeasure((1.0,)).path_wait_s(False) is None


def test_tp_takes_the_measured_share_and_the_in_step_all_reduces() -> None:
    cfg = PRESETS["pythia-14m"]
    local = LocalMeasure((1.1, 1.05), None, (0.016, 0.015), (0.0044, 0.0042))
    p = predict_for(cfg, "tp", 2, _links(), local=local, **CPU)
    assert p.terms["compute"] == pytest.approx(0.004 * 1.1)
    wait = 0.016 - 0.0044
    assert p.terms["all_reduce"] + p.terms["latency"] == pytest.approx(wait)
    assert any("replayed in the ranks" in a for a in p.assumptions)
    plain = predict_for(cfg, "tp", 2, _links(), **CPU)  # no measurement: the byte share
    assert plain.terms["compute"] < 0.004 and "replayed" not in " ".join(plain.assumptions)


def test_fsdp2_drops_the_fixed_terms_its_measured_share_holds() -> None:
    local = LocalMeasure((8.0, 8.2), None, (0.12, 0.12), (0.033, 0.034))
    p = predict_for(PRESETS["pythia-14m"], "fsdp", 2, _links(), local=local, **CPU)
    assert "fsdp_overhead" not in p.terms and "gather_copies" not in p.terms
    assert p.terms["compute"] == pytest.approx(0.004 * 8.2)
    assert p.terms["all_gather"] + p.terms["latency"] == pytest.approx(0.12 - 0.033)
    kept = predict_for(PRESETS["pythia-14m"], "fsdp-noreshard", 2, _links(), local=local, **CPU)
    assert "fsdp_overhead" not in kept.terms
    # the notes say what the prediction charged, not the per-unit figure it left out
    assert not any("per-unit overhead" in a for a in kept.assumptions)
    assert any("hooks are in the compute" in a for a in kept.assumptions)


def test_fsdp1_on_one_cuda_device_takes_the_measured_share_not_the_fixed_overhead() -> None:
    # One GPU: the ranks measure the wrapper's own cost (FSDP1 switches to NO_SHARD there, so
    # no collective is skipped or replayed); the per-unit overhead would count it twice.
    cfg, one = PRESETS["pythia-14m"], nominal_links(probe_cpu(1), 1)
    cuda = dict(CPU, device_type="cuda", dtype_bytes=2)
    local = LocalMeasure((1.3,), None, (0.0,), (0.0052,))
    p = predict_for(cfg, "fsdp", 1, one, local=local, **cuda)
    assert p.implementation == "FSDP1 FULL_SHARD" and "fsdp_overhead" not in p.terms
    assert p.terms["compute"] == pytest.approx(0.004 * 1.3)
    assert p.time_per_token_s == pytest.approx(0.004 * 1.3)
    modelled = predict_for(cfg, "fsdp", 1, one, **cuda)
    assert modelled.terms["fsdp_overhead"] > 0 and modelled.terms["compute"] == 0.004


def test_pipeline_stages_add_up() -> None:
    local = LocalMeasure((0.2, 0.9), (0.3, 0.9), (0.0052, 0.0052), (0.001, 0.0036))
    p = predict_for(PRESETS["pythia-14m"], "pipeline", 2, _links(), local=local, **CPU)
    assert p.terms["compute"] == pytest.approx(0.004 * 1.1)
    assert p.terms["p2p"] + p.terms["latency"] == pytest.approx(0.0052 - 0.0046)


def test_the_measure_needs_a_compute_to_scale() -> None:
    local = LocalMeasure((3.0, 3.0))
    kwargs = {**CPU, "compute_time_s": None}
    p = predict_for(PRESETS["pythia-14m"], "auto", 2, _links(), local=local, **kwargs)
    assert "compute" not in p.terms  # the roofline, unscaled


def _rank(rank: int, **fields: float | bool | None) -> RankResult:
    return RankResult(
        rank=rank,
        samples=(),
        peak_memory_bytes=0,
        memory_kind="",
        implementation=Implementation("", "", "gloo", ""),
        versions={},
        device_name="cpu",
        tokens=(),
        replicas=1,
        timed_from=0.0,
        **fields,  # type: ignore[arg-type]
    )


def test_the_gate_reads_every_ranks_figures_in_rank_order() -> None:
    spec = RunSpec("t::x", "tp", 2, "cpu", Workload(), 1, 0, 10.0)
    figures = dict(
        local_prefill_s=0.006, local_bare_prefill_s=0.006, local_replay_step_s=0.01,
        local_replay_compute_s=0.004,
    )  # fmt: skip
    ranks = (
        _rank(1, local_step_s=0.006, local_bare_step_s=0.004, **figures),
        _rank(0, local_step_s=0.004, local_bare_step_s=0.004, **figures),
    )
    run = RunResult(spec, ranks, 0.0, 0.0)  # type: ignore[call-arg]
    m = local_measure(run)
    assert m is not None and m.shares == (1.0, 1.5) and m.prefill_shares == (1.0, 1.0)
    missing = RunResult(spec, (_rank(0, local_step_s=0.004),), 0.0, 0.0)  # type: ignore[call-arg]
    assert local_measure(missing) is None


def test_a_compiled_gpu_run_adds_the_wrappers_time_to_its_cuda_graph_bare_step() -> None:
    # The bare step replays as a CUDA graph: host drift does not scale it, and a short
    # generation's fixed cost would be multiplied by a share of 20 (a small model's FSDP).
    figures = dict(local_step_s=0.0050, local_bare_step_s=0.00025)
    spec = RunSpec("t::x", "fsdp", 1, "cuda", Workload(model="pythia-14m"), 1, 0, 1)

    def run(graphs: bool | None) -> RunResult:  # None: a report from before the field
        rank = _rank(0, **figures, local_bare_cuda_graphs=graphs)
        return RunResult(spec, (rank,), 0.0, 0.0)  # type: ignore[call-arg]

    runs = {graphs: run(graphs) for graphs in (True, False, None)}
    m = local_measure(runs[True])
    assert m is not None and m.excess_s == (pytest.approx(0.00475),) and m.host_factors is None
    assert local_measure(runs[False]).excess_s is None  # eager, or a CPU rank's compiled bare
    assert local_measure(runs[None]).excess_s is None
    # The host's loop ran 1.3x slower beside the timed repeats than beside the measure: the
    # wrapper's host work is charged at the repeats' speed.
    slower = _rank(0, **figures, local_host_loop_s=0.010, local_bare_cuda_graphs=True)
    slower = replace(slower, host_loop_s=(0.012, 0.014, 0.013))
    scaled_run = replace(runs[True], ranks=(slower,))
    at_speed = local_measure(scaled_run)
    assert at_speed is not None and at_speed.host_factors == (pytest.approx(1.3),)
    assert at_speed.excess_s == (pytest.approx(0.00475 * 1.3),)

    cfg, one = PRESETS["pythia-14m"], nominal_links(probe_cpu(1), 1)
    cuda = dict(CPU, device_type="cuda", dtype_bytes=2, compute_time_s=0.0002)
    p = predict_for(cfg, "fsdp", 1, one, local=m, prefill_time_s=0.0004, **cuda)
    assert p.terms["compute"] == pytest.approx(0.0002 + 0.00475)
    assert "fsdp_overhead" not in p.terms
    # no prefill share measured: the wrapper's time is added to the prefill as to the step
    assert p.terms["prefill"] == pytest.approx((0.0004 - 0.0002) / 12)
    assert any("the wrapper's own time" in a for a in p.assumptions)
    slow = predict_for(cfg, "fsdp", 1, one, local=at_speed, **cuda)
    assert slow.terms["compute"] == pytest.approx(0.0002 + 0.00475 * 1.3)
    assert any("x 1.3 for the host's speed" in a for a in slow.assumptions)
    scaled = predict_for(cfg, "fsdp", 1, one, local=replace(m, excess_s=None), **cuda)
    assert scaled.terms["compute"] == pytest.approx(0.0002 * 20)


def test_a_failure_against_the_runs_own_step_says_what_the_compute_is() -> None:
    from pytest_distperf.perfmodel import failure_message

    cfg, one = PRESETS["pythia-14m"], nominal_links(probe_cpu(1), 1)
    cuda = dict(CPU, device_type="cuda", dtype_bytes=2)
    own = predict_for(cfg, "fsdp", 1, one, local=LocalMeasure((1.3,)), **cuda)
    message = failure_message(own, own.tokens_per_sec / 2, 0.7)
    assert "compute x 1.3: the share its ranks measured" in message
    assert "this run's own wrapped step, timed after its repeats" in message
    modelled = predict_for(cfg, "fsdp", 1, one, **cuda)
    message = failure_message(modelled, modelled.tokens_per_sec / 2, 0.7)
    assert "compute: measured single-rank 4 ms per token" in message
    assert "own wrapped step" not in message


def test_the_wrappers_added_time_combines_by_how_the_ranks_run() -> None:
    m = LocalMeasure((2.0, 3.0), excess_s=(0.001, 0.002))
    assert m.added_s(False) == pytest.approx(0.002) and m.added_s(True) == pytest.approx(0.003)
    assert LocalMeasure((0.9,), excess_s=(-0.0001,)).added_s(False) == 0.0  # never negative
    assert LocalMeasure((1.0,)).added_s(False) is None


def _tp_run(waited: float, own_wait: float | None) -> RunResult:
    """A tp run at 100 tok/s (10 ms per token) whose timing threads waited `waited` s per token
    for a core in the timed repeats, and `own_wait` in the phase after them."""
    from pytest_distperf.spec import Sample

    spec = RunSpec("t::x[tp-2cpu]", "tp", 2, "cpu", Workload(max_new_tokens=10), 1, 0, 10.0)
    sample = Sample(total_s=0.1, ttft_s=0.01, decode_s=0.09, queued_s=10 * waited, off_cpu_s=0.0)
    ranks = tuple(
        replace(
            _rank(rank, local_run_queue_wait_s=own_wait, run_queue_wait_per_token_s=waited),
            samples=(sample,),
        )
        for rank in (0, 1)
    )
    return RunResult(spec, ranks, 0.0, 0.0)  # type: ignore[call-arg]


def test_a_threshold_miss_is_not_excused_by_the_ranks_own_wait(tmp_path: Path) -> None:
    from pytest_distperf.judge.checks import CheckStatus, GateSettings
    from pytest_distperf.judge.gate import Gate
    from pytest_distperf.store.store import BaselineStore

    gate = Gate(probe_cpu(2), BaselineStore(tmp_path))
    settings = GateSettings(efficiency=0.7, tolerance=None)
    cfg = PRESETS["pythia-14m"]
    # predicted 200 tok/s: 100 measured is under 0.7 x 200; without a 6 ms wait it is 250
    prediction = predict_for(cfg, "auto", 2, _links(), **{**CPU, "compute_time_s": 0.005})
    busy = gate.decide(_tp_run(0.006, None), settings, prediction).threshold
    assert busy.status is CheckStatus.WARN and "machine busy" in busy.message
    own = gate.decide(_tp_run(0.006, 0.006), settings, prediction).threshold
    assert own.status is CheckStatus.FAIL


# --------------------------------------------------------------------------- where and how long


def test_ranks_measure_themselves_on_cpu_ranks_and_one_gpu_only() -> None:
    import torch

    from pytest_distperf.ranks.environment import measures_itself

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)  # a device object, no GPU needed
    assert [measures_itself(cpu, n) for n in (1, 2, 4)] == [False, True, True]
    assert [measures_itself(cuda, n) for n in (1, 2, 8)] == [True, False, False]


def test_a_larger_models_generation_gets_every_pair_it_may() -> None:
    from pytest_distperf.ranks.local import BUDGET_S, CPU_PAIRS, DEVICE_PAIRS, _repeats

    larger = Sample(0.2, None, None)  # a generation of a larger model on a CPU rank
    assert _repeats(CPU_PAIRS.most, larger, BUDGET_S) == 2  # what half a second held
    assert _repeats(CPU_PAIRS.most, larger, CPU_PAIRS.budget_s) == CPU_PAIRS.most
    assert _repeats(DEVICE_PAIRS.most, Sample(0.3, None, None), DEVICE_PAIRS.budget_s) == 7
    assert (
        _repeats(CPU_PAIRS.most, Sample(5.0, None, None), CPU_PAIRS.budget_s) == 1
    )  # one at least


def test_a_compiled_run_measures_its_compiled_steps_wrapped_and_bare() -> None:
    """The share of a compiled run is the compiled wrapper's over the compiled bare model: each
    generation runs the steps its timed repeats ran, not the eager loop."""
    import torch
    from distperf_model.config import Config
    from distperf_model.generate import decode_one_token, make_prompt, prefill
    from distperf_model.model import build_model

    from pytest_distperf.ranks.local import PairPlan, measure
    from pytest_distperf.ranks.timing import StepOverride

    cpu = torch.device("cpu")
    wrapped, bare = (build_model(Config.from_name("tiny"), seed=1) for _ in range(2))
    for model in (wrapped, bare):
        model.setup_caches(1, 8 + 6, device=cpu, dtype=torch.float32)
    prompt = make_prompt(wrapped.config, 1, 8, 1, cpu)
    ran: list[tuple[str, Any]] = []

    def counted(name: str, step: Any) -> Any:
        def call(model: Any, idx: Any, pos: Any) -> Any:
            ran.append((name, model))
            return step(model, idx, pos)

        return call

    def override(name: str) -> StepOverride:
        return StepOverride(counted(name, prefill), counted(name, decode_one_token))

    times = measure(
        wrapped, bare, prompt, 6, all_done=lambda any_collective: False,
        plan=PairPlan(most=2, budget_s=60.0), steps=override("wrapped"),
        bare_steps=override("bare"), bare_cuda_graphs=True,
    )  # fmt: skip
    assert times is not None and times.step_s > 0 and times.bare_step_s
    assert times.host_loop_s and times.host_loop_s > 0  # the host's speed beside the pairs
    assert times.bare_cuda_graphs  # said on, for the gate to add the wrapper's time
    # a first generation of each, then 2 pairs: 3 generations each, a prefill and 4 steps
    assert [name for name, _ in ran].count("wrapped") == 3 * 5
    assert [name for name, _ in ran].count("bare") == 3 * 5
    assert {id(model) for name, model in ran if name == "bare"} == {id(bare)}


def test_the_wait_for_a_core_is_the_timing_threads_where_the_process_figure_says_less() -> None:
    from pytest_distperf.judge.gate import _waited_for_a_core

    run = _tp_run(0.006, None)  # 6 ms per token both ways
    assert _waited_for_a_core(run) == pytest.approx(0.006)
    queued = replace(run.ranks[0].samples[0], queued_s=0.1)  # 10 ms per token in the repeats
    ranks = tuple(replace(r, samples=(queued,)) for r in run.ranks)
    assert _waited_for_a_core(replace(run, ranks=ranks)) == pytest.approx(0.01)
    unknown = replace(run.ranks[0].samples[0], queued_s=None)
    ranks = tuple(replace(r, samples=(unknown,)) for r in run.ranks)
    assert _waited_for_a_core(replace(run, ranks=ranks)) == pytest.approx(0.006)
