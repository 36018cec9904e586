"""tp and pipeline without ranks: their cost terms, the checks that refuse a model they cannot
split, the marker's tp_plan and comm_delay, point-to-point calibration figures, a pipeline of
one stage, and tp's by-hand split on one rank and on two ranks played by threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
import torch
from distperf_model.config import PRESETS, Config
from distperf_model.generate import generate, make_prompt
from distperf_model.model import build_model
from distperf_model.parallelize import (
    PipelineStage,
    delay_row_parallel_outputs,
    describe_tensor_parallel,
    split_blocks,
    tensor_parallel,
)
from helpers import fake_result, greedy_logits
from torch import nn

from pytest_distperf.judge import gate
from pytest_distperf.options import SettingError, workload_from_marker
from pytest_distperf.perfmodel import Calibration, CollectiveFigure, Links, links_from_calibration
from pytest_distperf.perfmodel.calibration import bus_factor
from pytest_distperf.ranks.strategies.tp import load_plan
from pytest_distperf.spec import RunSpec, Workload
from pytest_distperf.strategies import STRATEGIES, get_strategy
from pytest_distperf.strategies import message_sizes_for as message_sizes
from pytest_distperf.strategies import predict_for as predict

# Nominal PCIe through the host, with an overlap that tp and pipeline must not use.
PHB = Links("PHB", 4, 12e9, 50e-6, 510e9, False, overlap=0.9)
LLAMA = PRESETS["llama-2-7b"]


def test_tp_is_its_share_of_compute_plus_two_all_reduces_per_block() -> None:
    p = predict(LLAMA, "tp", 4, PHB, compute_time_s=0.04, prompt_length=8, max_new_tokens=50)
    activation = LLAMA.n_embd * 2  # batch 1 x 1 x n_embd in bf16
    transfer, latency = PHB.collective_time("all_reduce", activation, 4)
    all_reduces = 2 * LLAMA.n_layer
    assert p.collectives_per_token == all_reduces == 64
    assert p.terms["all_reduce"] == pytest.approx(all_reduces * transfer)
    assert p.terms["latency"] == pytest.approx(all_reduces * latency)
    # Each rank streams a quarter of the blocks and of the KV cache, and the whole head.
    blocks = LLAMA.n_layer * LLAMA.block_param_count() * 2
    head = LLAMA.padded_vocab_size * LLAMA.n_embd * 2
    kv = LLAMA.n_layer * 2 * LLAMA.n_query_groups * LLAMA.head_size * 58 * 2
    share = ((blocks + kv) / 4 + head) / (blocks + kv + head)
    assert p.terms["compute"] == pytest.approx(0.04 * share)
    assert 0.25 < share < 0.27  # compute / N but for the replicated head
    assert "overlap" not in p.terms  # every all-reduce is the next layer's input
    assert p.time_per_token_s == pytest.approx(sum(p.terms.values()))
    assert p.implementation == "TP 4-way (by hand)"
    assert p.bandwidth_used == PHB.busbw  # nominal: the all-reduce's bus bandwidth
    assert STRATEGIES["tp"].replicas(4) == 1  # one stream over all ranks


def test_tp_roofline_shares_the_weights_not_the_launches() -> None:
    whole = predict(LLAMA, "auto", 4, PHB)
    tp = predict(LLAMA, "tp", 4, PHB)
    assert tp.terms["launch"] == whole.terms["launch"]  # every rank launches every kernel
    assert 0.25 < tp.terms["weights"] / whole.terms["weights"] < 0.27


def test_pipeline_is_the_whole_compute_plus_its_hops() -> None:
    p = predict(LLAMA, "pipeline", 4, PHB, compute_time_s=0.04)
    activation, token = LLAMA.n_embd * 2, 8
    assert p.terms["compute"] == 0.04  # every block still runs, one stage after another
    # 3 hops of the activation, then the token back to the first rank, at the nominal figures
    assert p.terms["p2p"] == pytest.approx((3 * activation + token) / PHB.busbw)
    assert p.terms["latency"] == pytest.approx(4 * PHB.latency_s)
    assert p.collectives_per_token == 4
    assert "overlap" not in p.terms  # one stream: no stage overlaps another at batch 1
    assert any("no send/recv measured" in a for a in p.assumptions)
    assert STRATEGIES["pipeline"].replicas(4) == 1


def _calibration(**changes: object) -> Calibration:
    base = Calibration(
        world_size=2,
        backend="gloo",
        device_type="cpu",
        all_gather=(CollectiveFigure.from_time("all_gather", 4096, 100e-6, 2),),
        all_reduce=(CollectiveFigure.from_time("all_reduce", 4096, 120e-6, 2),),
        memory_bandwidth=10e9,
        latency_s=100e-6,
        p2p=(
            CollectiveFigure.from_time("p2p", 8, 30e-6, 2),
            CollectiveFigure.from_time("p2p", 512, 40e-6, 2),
        ),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_pipeline_hops_at_the_measured_send_recv() -> None:
    links = links_from_calibration(_calibration(), "LOOPBACK")
    p = predict(PRESETS["pythia-14m"], "pipeline", 2, links, compute_time_s=0.01, dtype_bytes=4)
    # the 512 B activation on (40 us) and the 8 B token back (30 us); the smallest is latency
    assert p.terms["latency"] == pytest.approx(2 * 30e-6)
    assert p.terms["p2p"] == pytest.approx(10e-6)
    assert any("send/recv measured in the ranks" in a for a in p.assumptions)
    assert p.bound_description.endswith("over LOOPBACK") or p.bound == "compute"


def test_p2p_figures_round_trip_and_older_reports_have_none() -> None:
    cal = _calibration()
    data = cal.to_dict()
    assert Calibration.from_dict(data) == cal
    older = {k: v for k, v in data.items() if k != "p2p"}
    assert Calibration.from_dict(older).p2p == ()
    wrong = {**data, "p2p": [CollectiveFigure.from_time("all_gather", 8, 1e-5, 2).to_dict()]}
    with pytest.raises(ValueError, match="a figure in p2p is not an p2p"):
        Calibration.from_dict(wrong)
    assert bus_factor("p2p", 4) == 1.0  # nccl-tests' sendrecv: busbw = algbw
    assert cal.busbw_at("p2p", 512) == pytest.approx(512 / 40e-6)


def test_message_sizes_of_tp_and_pipeline() -> None:
    cfg = PRESETS["pythia-14m"]
    tp = message_sizes(cfg, "tp", 2, 4, batch=2)
    assert 2 * cfg.n_embd * 4 in tp.all_reduce and tp.p2p == ()
    assert message_sizes(cfg, "pipeline", 2, 4, batch=2).p2p == (16, 2 * cfg.n_embd * 4)
    workloads = [("pipeline", Workload(model="pythia-14m", batch_size=2)), ("auto", Workload())]
    sizes = gate.session_message_sizes(workloads, 2)
    assert sizes is not None and sizes.p2p == (16, 1024)


def test_tp_refuses_heads_or_groups_it_cannot_split() -> None:
    check = get_strategy("tp").check
    assert check(PRESETS["pythia-14m"], 2) is None and check(PRESETS["pythia-14m"], 4) is None
    assert check(PRESETS["pythia-14m"], 3) == (
        "strategy 'tp' splits attention heads and the MLP's hidden dimension over the ranks: "
        "n_head=4 is not divisible by 3 ranks"
    )
    gqa = replace(LLAMA, name="gqa", n_query_groups=8)
    assert "n_query_groups=8 is not divisible by 16 ranks" in (check(gqa, 16) or "")


def test_pipeline_refuses_more_stages_than_blocks() -> None:
    check = get_strategy("pipeline").check
    assert check(PRESETS["pythia-14m"], 6) is None
    assert check(PRESETS["pythia-14m"], 8) == (
        "strategy 'pipeline' gives every rank at least one block: n_layer=6 is fewer than 8 ranks"
    )
    assert split_blocks(6, 4) == ((0, 2), (2, 4), (4, 5), (5, 6))
    with pytest.raises(ValueError, match="3 stages need at least 3 blocks, got 2"):
        split_blocks(2, 3)


TEST_TP_ON_3 = """
import pytest

@pytest.mark.strategy("tp", "pipeline")
@pytest.mark.devices(3)
@pytest.mark.distperf(model="pythia-14m")
def test_x(distperf):
    distperf.run()
"""


def test_a_model_tp_cannot_split_fails_its_test_naming_the_numbers(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_split=TEST_TP_ON_3)
    # only the tp item: pipeline over 3 ranks would fit and start ranks
    result = pytester.runpytest("--distperf-accelerator=cpu", "-k", "not pipeline")
    result.assert_outcomes(errors=1, deselected=1)
    result.stdout.fnmatch_lines(
        ["*distperf(model='pythia-14m'): strategy 'tp' *: n_head=4 is not divisible by 3 ranks*"]
    )


def test_marker_tp_plan_and_comm_delay() -> None:
    w = workload_from_marker({"tp_plan": "my.plans:split", "comm_delay": 0.01}, "t", ("tiny",))
    assert w.tp_plan == "my.plans:split" and w.comm_delay == 0.01
    for bad, match in (
        ({"tp_plan": "split"}, r"t: distperf\(tp_plan='split'\) must be 'package.module:function'"),
        ({"comm_delay": -1}, r"t: distperf\(comm_delay=-1\) must be seconds in \[0, 1\]"),
        ({"comm_delay": True}, r"comm_delay=True"),
    ):
        with pytest.raises(SettingError, match=match):
            workload_from_marker(bad, "t", ("tiny",))
    # a delayed run must meet its normal baseline, and an unset plan keeps old identities
    spec = RunSpec("t::x", "tp", 2, "cpu", Workload(comm_delay=0.01), 1, 0, 10.0)
    identity = gate.test_identity(fake_result(spec))
    assert "comm_delay" not in identity and "tp_plan" not in identity


class _Mesh:
    """The 1-D tensor-parallel mesh as `tensor_parallel` reads it: size, rank and group."""

    mesh_dim_names = None

    def __init__(self, ways: int = 2, rank: int = 0, group: Any = None) -> None:
        self.ways, self.rank, self.group = ways, rank, group

    def size(self) -> int:
        return self.ways

    def get_local_rank(self) -> int:
        return self.rank

    def get_group(self) -> Any:
        return self.group


def test_tp_asks_for_a_plan_for_a_model_it_does_not_know() -> None:
    class Mine(nn.Module):
        pass

    with pytest.raises(TypeError, match=r"no tensor-parallel plan for .*Mine: .*tp_plan="):
        tensor_parallel(Mine(), _Mesh())
    with pytest.raises(ImportError, match=r"tp_plan='no_such_module_x:plan'\): cannot import"):
        load_plan("no_such_module_x:plan")
    with pytest.raises(ValueError, match=r"tp_plan='math:pi' is not a function"):
        load_plan("math:pi")


def test_a_pipeline_of_one_stage_is_the_whole_model() -> None:
    cfg = PRESETS["tiny"]
    prompt = make_prompt(cfg, 2, 5, 7)
    whole = build_model(cfg, seed=7)
    whole.setup_caches(2, 17)
    expected = generate(whole, prompt, 12)[:, 5:]
    stage = PipelineStage(build_model(cfg, seed=7), rank=0, world_size=1)
    stage.module.setup_caches(2, 17, device=torch.device("cpu"), dtype=torch.float32)
    token = stage.next_token(prompt, torch.arange(5))
    tokens, position = [token], torch.tensor([5])
    for _ in range(11):
        token = stage.next_token(token, position)
        tokens.append(token)
        position = position + 1
    assert torch.equal(torch.cat(tokens, dim=1), expected)
    assert stage.describe() == "pipeline 1 stages of 2 blocks (send/recv)"


# --------------------------------------------------------------------------- tp's by-hand split

GQA = Config.from_name("tiny-llama")  # grouped-query attention, SwiGLU, no biases


def _reference(config: Config) -> Callable[[], nn.Module]:
    return lambda: build_model(config, seed=3)


def _litgpt_pythia() -> nn.Module:
    from litgpt import GPT
    from litgpt import Config as LitConfig

    torch.manual_seed(3)
    return GPT(LitConfig.from_name("pythia-14m")).eval()


def _logits(model: nn.Module) -> torch.Tensor:
    return torch.stack(greedy_logits(model))  # [4, B, V]


class _Threads:
    """Ranks played by threads of this process: `all_reduce` sums what every thread hands in,
    in rank order, so each gets the same sum, as gloo's would be."""

    def __init__(self, ways: int) -> None:
        self.barrier = threading.Barrier(ways, timeout=60)
        self.parts: list[torch.Tensor | None] = [None] * ways
        self.calls = 0

    def all_reduce(self, tensor: torch.Tensor, rank: int) -> None:
        self.parts[rank] = tensor.clone()
        self.calls += rank == 0
        self.barrier.wait()
        total = torch.stack([p for p in self.parts if p is not None]).sum(0)
        self.barrier.wait()  # nobody hands in the next part before all have summed this one
        tensor.copy_(total)


class _RankGroup:
    def __init__(self, threads: _Threads, rank: int) -> None:
        self.threads, self.rank = threads, rank


def _fake_all_reduce(
    tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
) -> None:
    group.threads.all_reduce(tensor, group.rank)


def _split_in_threads(
    make: Callable[[], nn.Module], ways: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[nn.Module], list[torch.Tensor], int]:
    """Each rank's split model and its logits, and how many all-reduces rank 0 ran."""
    threads = _Threads(ways)
    monkeypatch.setattr(torch.distributed, "all_reduce", _fake_all_reduce)
    models = [tensor_parallel(make(), _Mesh(ways, r, _RankGroup(threads, r))) for r in range(ways)]

    def run(rank: int) -> torch.Tensor:
        try:
            return _logits(models[rank])
        except BaseException:
            threads.barrier.abort()  # let the other rank fail too instead of waiting
            raise

    with ThreadPoolExecutor(ways) as pool:
        logits = list(pool.map(run, range(ways)))
    return models, logits, threads.calls


MODELS = {
    "tiny": _reference(PRESETS["tiny"]),  # biases, fused qkv, GELU MLP, parallel residual
    "gqa-llama": _reference(GQA),  # grouped queries, SwiGLU with fc_1 and fc_2, no biases
    "litgpt-pythia-14m": _litgpt_pythia,  # LitGPT's own GPT: head counts in its config
}


@pytest.mark.parametrize("name", MODELS)
def test_tp_by_hand_on_two_ranks_gives_the_whole_models_logits(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name.startswith("litgpt"):
        pytest.importorskip("litgpt", reason="LitGPT is an optional extra")
    whole_model = MODELS[name]()
    expected = _logits(whole_model)
    models, logits, all_reduces = _split_in_threads(MODELS[name], 2, monkeypatch)
    for rank, got in enumerate(logits):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4, msg=f"rank {rank}")
    blocks = len(models[0].transformer.h)
    assert all_reduces == 4 * 2 * blocks  # prefill and 3 steps, after attention and the MLP
    whole, block = whole_model.transformer.h[0], models[1].transformer.h[0]
    qkv, mlp = block.attn.qkv, block.mlp
    assert qkv.out_features == whole.attn.qkv.out_features // 2  # this rank's heads and groups
    assert tuple(qkv.weight.shape) == (qkv.out_features, qkv.in_features)
    assert block.attn.proj.in_features == whole.attn.proj.in_features // 2
    assert tuple(mlp.proj.weight.shape) == (mlp.proj.out_features, mlp.proj.in_features)
    # a row-wise bias stays whole on every rank and is added once, after the all-reduce
    assert mlp.proj.bias is None
    kept = getattr(mlp.proj, "bias_after_all_reduce", None)
    if whole.mlp.proj.bias is not None:
        assert kept is not None and torch.equal(kept, whole.mlp.proj.bias)
    lines = 2 * blocks if name == "gqa-llama" else blocks  # fc_1 and fc_2, or fc
    assert describe_tensor_parallel(models[0]) == (
        f"TP 2-way: {blocks + lines} column-wise, {2 * blocks} row-wise linears"
    )


def test_tp_on_one_rank_is_the_plain_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_all_reduce(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("one rank all-reduced")

    monkeypatch.setattr(torch.distributed, "all_reduce", no_all_reduce)
    expected = _logits(build_model(PRESETS["tiny"], seed=3))
    model = build_model(PRESETS["tiny"], seed=3)
    before = {name: (p, p.data_ptr(), p.detach().clone()) for name, p in model.named_parameters()}
    assert tensor_parallel(model, _Mesh(1)) is model
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()  # same count, same names: the bias where it was
    for name, (param, pointer, values) in before.items():
        assert after[name] is param and param.data_ptr() == pointer, name
        assert torch.equal(param, values), name
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert model.transformer.h[0].attn.n_head == PRESETS["tiny"].n_head
    assert torch.equal(_logits(model), expected)
    assert describe_tensor_parallel(model) == "TP 1-way: 4 column-wise, 4 row-wise linears"
    assert describe_tensor_parallel(build_model(PRESETS["tiny"], seed=3)) == "replicated"


def test_comm_delay_sleeps_after_each_by_hand_all_reduce(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    models, _, _ = _split_in_threads(_reference(PRESETS["tiny"]), 2, monkeypatch)
    model = models[0]
    assert delay_row_parallel_outputs(model, 0.001) == 2 * PRESETS["tiny"].n_layer
    proj = model.transformer.h[0].mlp.proj
    hooks = [getattr(h, "func", h).__name__ for h in proj._forward_hooks.values()]
    assert hooks == ["_all_reduce_output", "_sleep_after"]  # the sleep after the sum
    assert not model.transformer.h[0].mlp.fc._forward_hooks  # column-wise: no collective


def test_a_dtensor_plan_is_still_described_and_delayed() -> None:
    """A marker's own plan may place DTensors: read from their placements (one gloo rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = build_model(PRESETS["tiny"], seed=3)
        for block in model.transformer.h:
            plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
            parallelize_module(block.mlp, mesh, plan)
        assert describe_tensor_parallel(model) == (
            "TP 1-way DTensor: 2 column-wise, 2 row-wise linears"
        )
        assert delay_row_parallel_outputs(model, 0.0) == 2
    finally:
        dist.destroy_process_group()
