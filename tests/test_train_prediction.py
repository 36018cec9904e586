"""The performance model of one training step (perfmodel/train.py) and each strategy's training
terms, by hand on a small shape; `distperf predict --mode train`. Pure: no rank, no torch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_distperf.cli import main
from pytest_distperf.perfmodel import (
    Calibration,
    CollectiveFigure,
    Links,
    failure_message,
    model_flops_per_step,
)
from pytest_distperf.perfmodel.prediction import describe_prediction
from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.perfmodel.terms import LINK_TERMS
from pytest_distperf.perfmodel.train import ADAMW_ACCESSES, BACKWARD_SHARE, predict_train
from pytest_distperf.strategies import (
    STRATEGIES,
    get_strategy,
    predict_train_for,
    strategy_names,
    train_message_sizes_for,
)
from pytest_distperf.strategies.replicated import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    ddp_buckets,
)

SEED = Path(__file__).parent / "data" / "topologies" / "topo_seed_4x_a10g_phb.txt"
BUSBW = 100e9
LATENCY = 10e-6
MEMORY = 1e12
LINKS = Links("NV18", 2, BUSBW, LATENCY, MEMORY, False)
SMALL = ModelShape(
    n_layer=2,
    n_embd=8,
    n_head=2,
    n_query_groups=2,
    head_size=4,
    vocab_size=16,
    padded_vocab_size=16,
    intermediate_size=32,
    block_size=64,
    block_params=1000,
    non_block_params=300,
)
# 10M parameters a block: fp32 gradients fill several DDP buckets, and the block gathers are
# large enough that the transfer terms are not latency.
LARGE = replace(SMALL, n_layer=4, block_params=10_000_000, non_block_params=3_000_000)
TRAINABLE = tuple(n for n in strategy_names() if not STRATEGIES[n].train_refusal)


def _predict(name: str, shape: ModelShape = LARGE, devices: int = 2, **kwargs):
    args = {
        "device_type": "cuda",
        "batch_size": 2,
        "seq_length": 8,
        "param_bytes": 4,
        "comm_bytes": 4,
        "matmul_flops_per_s": 1e12,
    }
    args.update(kwargs)
    links = args.pop("links", replace(LINKS, world_size=devices))
    return predict_train_for(shape, name, devices, links, **args)


# --------------------------------------------------------------------------- compute


def test_model_flops_by_hand() -> None:
    tokens = 2 * 8
    params = 2 * 1000 + 16 * 8  # the blocks and the head; the embedding is a lookup
    attention = 12 * 2 * 2 * 4 * 8 * tokens  # full, not causal-halved
    assert model_flops_per_step(SMALL, 2, 8) == 6 * params * tokens + attention
    # linear in the batch; the attention part quadratic in the sequence
    assert model_flops_per_step(SMALL, 4, 8) == 2 * model_flops_per_step(SMALL, 2, 8)
    quad = model_flops_per_step(SMALL, 1, 16) - 2 * model_flops_per_step(SMALL, 1, 8)
    assert quad == 12 * 2 * 2 * 4 * (16 * 16 - 2 * 8 * 8)


def test_compute_from_flops_and_optimizer_from_memory() -> None:
    p = _predict("ddp", shape=SMALL, devices=1, matmul_flops_per_s=2e9)
    assert p.mode == "train"
    assert p.terms["compute"] == pytest.approx(model_flops_per_step(SMALL, 2, 8) / 2e9)
    params = 2 * 1000 + 300
    assert p.terms["optimizer"] == pytest.approx(ADAMW_ACCESSES * params * 4 / MEMORY)
    # a measured step replaces both: AdamW is inside it
    measured = _predict("ddp", shape=SMALL, devices=1, step_compute_s=0.25)
    assert measured.terms == {"compute": 0.25}
    assert measured.step_time_s == 0.25


def test_rate_counts_every_replicas_tokens() -> None:
    ddp = _predict("ddp", devices=4, step_compute_s=0.5)
    assert ddp.tokens_per_step == 4 * 2 * 8  # four data-parallel replicas
    assert ddp.tokens_per_sec == pytest.approx(ddp.tokens_per_step / ddp.step_time_s)
    assert ddp.time_per_token_s == pytest.approx(ddp.step_time_s / ddp.tokens_per_step)
    tp = _predict("tp", devices=4, step_compute_s=0.5)
    assert tp.tokens_per_step == 2 * 8  # one stream over all ranks
    for p in (ddp, tp):
        assert p.bound == max(p.terms, key=p.terms.__getitem__)
        assert p.step_time_s == pytest.approx(sum(p.terms.values()))


# --------------------------------------------------------------------------- strategies


def test_ddp_all_reduces_every_parameter_in_buckets() -> None:
    p = _predict("ddp", step_compute_s=10.0)
    total = (4 * 10_000_000 + 3_000_000) * 4
    assert p.bytes_per_token["all_reduce_bytes"] == total
    buckets = ddp_buckets(total)
    assert sum(buckets) == total and buckets[0] == DDP_FIRST_BUCKET_BYTES
    assert max(buckets) == DDP_BUCKET_BYTES and len(buckets) > 3
    assert p.expected_collectives == {"all_reduce": (len(buckets), total)}
    # nominal ring all-reduce over 2 ranks: bytes x 2(n-1)/n = bytes over the bus bandwidth
    assert p.terms["grad_all_reduce"] == pytest.approx(total / BUSBW)
    assert p.terms["latency"] == pytest.approx(len(buckets) * LATENCY)
    assert "overlap" not in p.terms  # nominal links: nothing measured hides, terms add up
    # gradients in the parameters' dtype: bf16 weights move half the bytes; bf16-mixed's float32
    # weights (comm_bytes 2 for FSDP) still all-reduce float32 gradients
    half = _predict("ddp", step_compute_s=10.0, param_bytes=2, comm_bytes=2)
    assert half.bytes_per_token["all_reduce_bytes"] == total / 2
    mixed = _predict("ddp", step_compute_s=10.0, comm_bytes=2)
    assert mixed.bytes_per_token["all_reduce_bytes"] == total


def test_ddp_hides_all_but_the_last_bucket_behind_backward() -> None:
    links = replace(LINKS, overlap=1.0)
    total = (4 * 10_000_000 + 3_000_000) * 4
    last = ddp_buckets(total)[-1]
    transfer = total / BUSBW + len(ddp_buckets(total)) * LATENCY
    slow_compute = _predict("ddp", links=links, step_compute_s=10.0)
    assert -slow_compute.terms["overlap"] == pytest.approx(transfer - (last / BUSBW + LATENCY))
    fast_compute = _predict("ddp", links=links, step_compute_s=1e-4)
    assert -fast_compute.terms["overlap"] == pytest.approx(BACKWARD_SHARE * 1e-4)


def test_fsdp_gathers_twice_when_resharding_once_without() -> None:
    reshard = _predict("fsdp2", step_compute_s=1.0)
    kept = _predict("fsdp-noreshard", step_compute_s=1.0)
    units = 4 + 1
    block, root = 10_000_000 * 4, 3_000_000 * 4
    unit_bytes = 4 * block + root
    assert reshard.expected_collectives == {
        "all_gather": (2 * units, 2 * unit_bytes),
        "reduce_scatter": (units, unit_bytes),
    }
    assert kept.expected_collectives == {
        "all_gather": (units, unit_bytes),
        "reduce_scatter": (units, unit_bytes),
    }
    # all-gather: (n-1)/n of the gathered bytes; reduce-scatter at the same ring figures
    assert reshard.terms["all_gather"] == pytest.approx(2 * unit_bytes * 0.5 / BUSBW)
    assert kept.terms["all_gather"] == pytest.approx(unit_bytes * 0.5 / BUSBW)
    assert kept.terms["reduce_scatter"] == pytest.approx(unit_bytes * 0.5 / BUSBW)
    assert reshard.terms["fsdp_overhead"] > kept.terms["fsdp_overhead"]
    assert reshard.terms["gather_copies"] > kept.terms["gather_copies"] > 0
    # each rank steps only its shard of the parameters with AdamW
    flops = _predict("fsdp2")
    assert flops.terms["optimizer"] == pytest.approx(_predict("ddp").terms["optimizer"] / 2)


def test_fsdp_is_fsdp1_on_cuda_fsdp2_on_cpu() -> None:
    cuda = _predict("fsdp", step_compute_s=1.0)
    assert cuda.implementation == "FSDP1 FULL_SHARD"
    # the root is gathered in forward only; the blocks again in backward
    assert cuda.expected_collectives["all_gather"][0] == 1 + 2 * 4
    assert "gather_copies" not in cuda.terms
    cpu = _predict("fsdp", step_compute_s=1.0, device_type="cpu")
    assert cpu.terms == _predict("fsdp2", step_compute_s=1.0, device_type="cpu").terms


def test_fsdp_overlap_leaves_the_first_gather_and_last_reduction() -> None:
    links = replace(LINKS, overlap=1.0)
    p = _predict("fsdp-noreshard", links=links, step_compute_s=100.0)
    transfer = sum(p.terms[k] for k in ("all_gather", "reduce_scatter", "latency"))
    transfer += p.terms["gather_copies"]
    root = 3_000_000 * 4 * 0.5 / BUSBW + LATENCY  # the root's gather and reduce-scatter
    assert -p.terms["overlap"] == pytest.approx(transfer - 2 * root)


def test_tp_four_all_reduces_per_block_never_hidden() -> None:
    links = replace(LINKS, overlap=1.0)
    p = _predict("tp", links=links, step_compute_s=1.0)
    size = 2 * 8 * 8 * 4  # batch x seq_length x n_embd x comm_bytes
    assert p.expected_collectives == {"all_reduce": (4 * 4, 4 * 4 * size)}
    assert p.terms["all_reduce"] == pytest.approx(4 * 4 * size / BUSBW)
    assert p.terms["latency"] == pytest.approx(4 * 4 * LATENCY)
    assert "overlap" not in p.terms
    # a rank computes its share of the blocks and the head whole
    assert 0.5 < p.terms["compute"] < 1.0


def test_one_device_has_no_collective_term() -> None:
    for name in TRAINABLE:
        p = _predict(name, devices=1, step_compute_s=1.0)
        assert not set(p.terms) & LINK_TERMS, name
        assert p.terms["compute"] == 1.0, name  # no share: the whole model on one rank
    assert _predict("ddp", devices=1, step_compute_s=1.0).expected_collectives == {}


def test_pipeline_cannot_train_and_says_why() -> None:
    record = get_strategy("pipeline")
    assert "backward" in record.train_refusal
    with pytest.raises(ValueError, match="strategy 'pipeline' cannot train: .*backward"):
        _predict("pipeline")
    assert TRAINABLE and set(TRAINABLE) < set(strategy_names())


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="strategy 'fsdp'.*step_compute_s.*matmul_flops_per_s"):
        _predict("fsdp", matmul_flops_per_s=None)
    with pytest.raises(ValueError, match="seq_length must be a positive int"):
        _predict("ddp", seq_length=0)
    with pytest.raises(ValueError, match="step_compute_s must be > 0"):
        _predict("ddp", step_compute_s=-1.0)
    for bad in (0.0, float("nan"), float("inf")):  # a step the ranks could not time
        with pytest.raises(ValueError, match=f"step_compute_s must be > 0 and finite, got {bad}"):
            _predict("ddp", step_compute_s=bad)
    with pytest.raises(ValueError, match="unknown strategy 'zero3'"):
        _predict("zero3")


def test_counted_collectives_replace_the_expected_ones() -> None:
    expected = _predict("ddp", step_compute_s=1.0)
    same = _predict("ddp", step_compute_s=1.0, counted_collectives=expected.expected_collectives)
    assert same.terms == expected.terms and same.counted_collectives is not None
    counted = {"all_reduce": (3.0, 3 * 2048.0)}  # three small all-reduces, say
    p = _predict("ddp", step_compute_s=1.0, counted_collectives=counted)
    assert p.terms["grad_all_reduce"] == pytest.approx(3 * 2048 / BUSBW)
    assert p.terms["latency"] == pytest.approx(3 * LATENCY)
    assert p.expected_collectives == expected.expected_collectives
    assert p.collectives_per_token == 3
    assert any(a.startswith("collectives as counted in this run's ranks") for a in p.assumptions)
    # a reduce-scatter the model does not expect is charged at the all-gather figures
    tp = _predict("tp", step_compute_s=1.0, counted_collectives={"reduce_scatter": (1, 1e6)})
    assert "all_reduce" not in tp.terms
    assert tp.terms["reduce_scatter"] == pytest.approx(1e6 * 0.5 / BUSBW)
    message = describe_prediction(tp)
    assert "collectives per step, predicted: all_reduce 16 x" in message
    assert "counted: reduce_scatter 1 x 1 MB" in message


def test_calibrated_links_time_each_size() -> None:
    gathers = tuple(
        CollectiveFigure.from_time("all_gather", b, t, 2)
        for b, t in ((4096, 50e-6), (2**30, 10e-3))
    )
    reduces = tuple(
        CollectiveFigure.from_time("all_reduce", b, t, 2)
        for b, t in ((4096, 60e-6), (2**30, 20e-3))
    )
    cal = Calibration(2, "nccl", "cuda", gathers, reduces, MEMORY, 50e-6, overlap=0.5)
    from pytest_distperf.perfmodel import links_from_calibration

    links = links_from_calibration(cal, "NV18")
    p = _predict("ddp", links=links, step_compute_s=10.0)
    total = (4 * 10_000_000 + 3_000_000) * 4
    expected = sum(cal.time_at("all_reduce", b) for b in ddp_buckets(total))
    assert p.terms["grad_all_reduce"] + p.terms["latency"] == pytest.approx(expected)
    assert p.terms["overlap"] < 0 and p.measured_links


# --------------------------------------------------------------------------- sizes, messages


def test_train_message_sizes() -> None:
    total = (4 * 10_000_000 + 3_000_000) * 4  # DDP: float32 gradients
    sizes = train_message_sizes_for(LARGE, strategy_names(), 2, 4, 2, 2, 8)
    assert set(ddp_buckets(total)) <= set(sizes.all_reduce)
    assert {10_000_000 * 2, 3_000_000 * 2} <= set(sizes.all_gather)  # a block and the root
    assert 2 * 8 * 8 * 2 in sizes.all_reduce  # tp's activation
    only_pipeline = train_message_sizes_for(LARGE, "pipeline", 2, 4, 2, 2, 8)
    assert len(only_pipeline.all_gather) == 1 and not only_pipeline.p2p  # the latency probe


def test_train_message_reads_per_step() -> None:
    p = _predict("fsdp2", step_compute_s=0.1)
    text = describe_prediction(p)
    assert text.startswith(f"predicted {p.tokens_per_sec:.3g} tok/s (step ")
    assert "compute 100 ms, all_gather " in text and "; bound: compute" in text
    assert "collectives per step" in text
    failed = failure_message(p, p.tokens_per_sec / 2, 0.7)
    assert "measured/predicted = 0.50" in failed and "(step " in failed
    data = p.to_dict()
    assert data["mode"] == "train" and data["step_time_s"] == p.step_time_s
    assert data["tokens_per_step"] == 2 * 2 * 8


def test_predict_train_takes_the_record_itself() -> None:
    record = get_strategy("tp")
    direct = predict_train(
        LARGE,
        record,
        2,
        LINKS,
        device_type="cpu",
        batch_size=2,
        seq_length=8,
        param_bytes=4,
        comm_bytes=4,
        step_compute_s=1.0,
    )
    assert direct == _predict("tp", device_type="cpu", step_compute_s=1.0)


# --------------------------------------------------------------------------- CLI


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    base = ("predict", "--model", "pythia-2.8b", "--devices", "4", "--nvidia-smi-topo", str(SEED))
    code = main([*base, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_train_prints_every_strategy_that_can_train(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--mode", "train", "--seq-length", "512", "--matmul-tflops", "100")
    code, out, err = _cli(capsys, *args, "--precision", "bf16-mixed")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isalpha()}
    assert set(TRAINABLE) <= set(rows)
    assert "cannot train" in rows["pipeline"]
    assert "1 x 512 tokens per data-parallel rank" in out and "terms (ms per step)" in out
    code, out, err = _cli(capsys, *args, "--json")
    assert code == 0, err
    data = json.loads(out)
    by = {p["strategy"]: p for p in data["predictions"]}
    assert set(by) == set(TRAINABLE) and "pipeline" in data["cannot_train"]
    assert all(p["mode"] == "train" and 0 < p["mfu"] <= 1 for p in by.values())
    # PCIe through the host: FSDP's gathers outweigh DDP's one all-reduce of the gradients
    assert by["ddp"]["tokens_per_sec"] > by["fsdp2"]["tokens_per_sec"]


def test_cli_generate_is_the_default_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys)
    assert code == 0 and "ms/step" not in out and "tok/s" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--mode", "train"), "--mode train needs --matmul-tflops X"),
        (
            ("--mode", "train", "--matmul-tflops", "100", "--strategy", "pipeline"),
            "--strategy pipeline: cannot train",
        ),
        (
            ("--mode", "train", "--matmul-tflops", "100", "--seq-length", "9999"),
            "--seq-length 9999 exceeds pythia-2.8b's block_size",
        ),
        (("--precision", "bf16-mixed"), "--precision bf16-mixed: training only"),
    ],
)
def test_cli_train_errors(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, _, err = _cli(capsys, *argv)
    assert code == 2
    assert message in err and "Traceback" not in err
