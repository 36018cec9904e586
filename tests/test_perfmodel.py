"""The performance model against the reference measurements, plus its algebra and messages.

Reference rows come from ../shared/reference/measurements.md ("R": the throwaway script on a
2 x H200 host) and from this project's own runs on a 2 x H200 machine ("P": the launcher and
worker of this repository, torch 2.11, 50 new tokens, median of 3). The collective figures are
calibrate()'s output on that machine at the models' own message sizes, over NVLink (NV18) and
with NCCL_P2P_DISABLE=1 (traffic staged through host memory). Every prediction takes the
replicated run's measured time per token as its compute term, as the plugin does.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from distperf_model.config import PRESETS

from pytest_distperf.perfmodel import (
    GB,
    Calibration,
    CollectiveFigure,
    Links,
    Overheads,
    Prediction,
    failure_message,
    links_from_calibration,
    threshold,
)
from pytest_distperf.perfmodel import terms as pm_terms
from pytest_distperf.perfmodel.calibration import bus_factor
from pytest_distperf.perfmodel.links import nominal_links
from pytest_distperf.perfmodel.prediction import describe_prediction
from pytest_distperf.strategies import predict_all_for, predict_for
from pytest_distperf.topology import load_nvidia_smi_topo

DATA = Path(__file__).parent / "data" / "topologies"
SEED_TOPO = DATA / "topo_seed_4x_a10g_phb.txt"

# calibrate() on 2 x H200 (torch 2.11, NCCL, bf16): (all-gather output bytes, seconds). The
# sizes include one pythia-2.8b block (157 MB), one llama-2-7b block (405 MB) and both roots.
H200_NVLINK_GATHER = (
    (4096, 66.0e-6),
    (1048576, 62.3e-6),
    (16777216, 108.3e-6),
    (67108864, 206.6e-6),
    (157352960, 405.5e-6),
    (268435456, 620.9e-6),
    (404766720, 928.3e-6),
    (515123200, 1116.0e-6),
    (524296192, 1129.4e-6),
    (1073741824, 2100.7e-6),
)
H200_HOST_STAGED_GATHER = (
    (4096, 37.6e-6),
    (1048576, 65.4e-6),
    (16777216, 371.4e-6),
    (67108864, 1376.2e-6),
    (157352960, 3195.2e-6),
    (268435456, 5408.2e-6),
    (404766720, 8145.5e-6),
    (515123200, 10321.3e-6),
    (524296192, 10505.5e-6),
    (1073741824, 21461.5e-6),
)
H200_COPY = 4.207e12  # bytes/s, a 4 GiB device copy, read + write counted

# calibrate() with gloo, 2 ranks of 1 thread on a 2-core host, fp32, cpu-110m's sizes.
CPU_GATHER = ((4096, 0.235e-3), (50384896, 59.92e-3), (67117056, 81.98e-3))


def _calibration(
    gathers: tuple[tuple[int, float], ...],
    memory: float,
    backend: str = "nccl",
    device_type: str = "cuda",
    fresh_copy: float = 0.0,
) -> Calibration:
    figures = tuple(CollectiveFigure.from_time("all_gather", b, t, 2) for b, t in gathers)
    return Calibration(
        world_size=2,
        backend=backend,
        device_type=device_type,
        all_gather=figures,
        all_reduce=(CollectiveFigure.from_time("all_reduce", 4096, 55e-6, 2),),
        memory_bandwidth=memory,
        latency_s=min(t for _, t in gathers),
        fresh_copy_bandwidth=fresh_copy,
    )


NVLINK = links_from_calibration(_calibration(H200_NVLINK_GATHER, H200_COPY), "NV18")
HOST_STAGED = links_from_calibration(_calibration(H200_HOST_STAGED_GATHER, H200_COPY), "PHB")


def _nccl_tests_only(busbw_gbps: float, link_class: str) -> Links:
    """What measurements.md states: one 1 GiB bus bandwidth (and an assumed 60 us latency)."""
    gib = 1 << 30
    t = gib * bus_factor("all_gather", 2) / (busbw_gbps * GB)
    return links_from_calibration(_calibration(((4096, 60e-6), (gib, t)), H200_COPY), link_class)


# (source, model, links, strategy, replicated tok/s measured alongside, measured tok/s, tolerance)
H200_ROWS = [
    ("R", "pythia-2.8b", "nvlink", "fsdp", 103.8, 20.1),
    ("R", "pythia-2.8b", "nvlink", "fsdp2", 103.8, 17.0),
    ("R", "pythia-2.8b", "nvlink", "fsdp-noreshard", 103.8, 45.4),
    ("R", "llama-2-7b", "nvlink", "fsdp", 79.0, 13.7),
    ("R", "llama-2-7b", "nvlink", "fsdp2", 79.0, 16.0),
    ("R", "llama-2-7b", "nvlink", "fsdp-noreshard", 79.0, 45.2),
    ("R", "pythia-2.8b", "host", "fsdp", 107.6, 7.05),
    ("R", "pythia-2.8b", "host", "fsdp-noreshard", 107.6, 63.4),
    ("P", "pythia-2.8b", "nvlink", "fsdp", 61.27, 18.99),
    ("P", "pythia-2.8b", "nvlink", "fsdp2", 61.27, 18.91),
    ("P", "pythia-2.8b", "nvlink", "fsdp-noreshard", 61.27, 43.33),
    ("P", "llama-2-7b", "nvlink", "fsdp", 42.39, 13.68),
]


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


@pytest.mark.parametrize(
    ("source", "model", "path", "strategy", "replicated", "measured"),
    H200_ROWS,
    ids=[f"{r[0]}-{r[1]}-{r[2]}-{r[3]}" for r in H200_ROWS],
)
def test_h200_rows_within_25_percent(
    source: str, model: str, path: str, strategy: str, replicated: float, measured: float
) -> None:
    links = NVLINK if path == "nvlink" else HOST_STAGED
    p = predict_for(PRESETS[model], strategy, 2, links, compute_time_s=1 / replicated)
    assert abs(_error(p.tokens_per_sec, measured)) <= 0.25, (p.tokens_per_sec, measured, p.terms)


def test_h200_rows_from_nccl_tests_figures_alone() -> None:
    # measurements.md gives only the 1 GiB bus bandwidth; interpolating down to a block's size
    # from it changes little over NVLink (the real-size latency is small next to FSDP's own
    # per-unit cost), so the reference rows hold with those figures too.
    nvlink = _nccl_tests_only(268.0, "NV18")
    host = _nccl_tests_only(25.2, "PHB")
    rows = [
        ("pythia-2.8b", nvlink, "fsdp", 103.8, 20.1),
        ("llama-2-7b", nvlink, "fsdp", 79.0, 13.7),
        ("pythia-2.8b", host, "fsdp", 107.6, 7.05),
    ]
    for model, links, strategy, replicated, measured in rows:
        p = predict_for(PRESETS[model], strategy, 2, links, compute_time_s=1 / replicated)
        assert abs(_error(p.tokens_per_sec, measured)) <= 0.25, (model, p.tokens_per_sec)


def test_host_staged_fsdp_on_the_project_run_needs_the_overlap() -> None:
    # On the machine of the project's runs, FSDP1 over the host-staged path (9.72 tok/s) hid
    # the compute and the per-unit overhead behind the transfer; the reference host (7.05) did
    # not. Added up, the terms are pessimistic by a third; with the overlap that machine
    # measures (~1) the prediction lands on the measurement.
    added = predict_for(PRESETS["pythia-2.8b"], "fsdp", 2, HOST_STAGED, compute_time_s=1 / 57.93)
    assert -0.35 <= _error(added.tokens_per_sec, 9.72) < -0.2
    overlapped = replace(HOST_STAGED, overlap=1.0)
    p = predict_for(PRESETS["pythia-2.8b"], "fsdp", 2, overlapped, compute_time_s=1 / 57.93)
    assert abs(_error(p.tokens_per_sec, 9.72)) <= 0.05
    assert p.bound == "all_gather"


def test_overlap_hides_the_shorter_path() -> None:
    cfg = PRESETS["pythia-2.8b"]
    added = predict_for(cfg, "fsdp", 2, HOST_STAGED, compute_time_s=0.01)
    assert "overlap" not in added.terms
    host = sum(v for k, v in added.terms.items() if k in pm_terms.HOST_PATH_TERMS)
    transfer = added.time_per_token_s - host
    assert transfer > host  # host-staged: the transfer is the longer path
    for share in (0.25, 0.5, 1.0):
        p = predict_for(cfg, "fsdp", 2, replace(HOST_STAGED, overlap=share), compute_time_s=0.01)
        assert p.terms["overlap"] == pytest.approx(-share * host)
        assert p.time_per_token_s == pytest.approx(host + transfer - share * host)
        assert p.bound == "all_gather"
        assert any("overlap" in a for a in p.assumptions)
    # nothing to overlap without a per-token collective
    for name in ("auto", "fsdp-noreshard"):
        q = predict_for(cfg, name, 2, replace(HOST_STAGED, overlap=1.0), compute_time_s=0.01)
        assert "overlap" not in q.terms


def test_cpu_ranks_count_on_no_overlap_whatever_the_calibration_saw() -> None:
    # Their threads fill the cores: a gloo collective's threads take time from the compute.
    cfg, links = PRESETS["pythia-14m"], replace(HOST_STAGED, overlap=0.9)
    on_gpu = predict_for(cfg, "fsdp", 2, links, compute_time_s=0.01)
    on_cpu = predict_for(cfg, "fsdp", 2, links, compute_time_s=0.01, device_type="cpu")
    quiet = predict_for(cfg, "fsdp", 2, HOST_STAGED, compute_time_s=0.01, device_type="cpu")
    assert on_gpu.terms["overlap"] < 0 and "overlap" not in on_cpu.terms
    assert on_cpu.terms == quiet.terms
    assert "CPU ranks: no overlap assumed" in " ".join(on_cpu.assumptions)
    assert not any("no overlap" in a for a in quiet.assumptions)  # none measured, none to say


def test_calibrated_overlap_reaches_the_links() -> None:
    cal = replace(_calibration(H200_HOST_STAGED_GATHER, H200_COPY), overlap=0.8)
    assert links_from_calibration(cal, "PHB").overlap == 0.8
    assert Calibration.from_dict(cal.to_dict()).overlap == 0.8
    old_report = cal.to_dict()
    del old_report["overlap"]  # written before the overlap was measured
    assert Calibration.from_dict(old_report).overlap == 0.0
    with pytest.raises(ValueError, match="overlap must be in"):
        replace(cal, overlap=1.5)
    old_report["overlap"] = "most"
    with pytest.raises(ValueError, match="field 'overlap' must be a number"):
        Calibration.from_dict(old_report)


@pytest.mark.parametrize(("model", "measured"), [("pythia-2.8b", 103.8), ("llama-2-7b", 79.0)])
def test_roofline_with_eager_launch_matches_replicated_h200(model: str, measured: float) -> None:
    p = predict_for(PRESETS[model], "auto", 2, NVLINK)
    assert set(p.terms) == {"weights", "launch"}
    assert abs(_error(p.tokens_per_sec, measured)) <= 0.10
    assert any("roofline" in a for a in p.assumptions)


def test_cpu_rows_of_this_project() -> None:
    # cpu-110m, 2 gloo ranks on a 2-core host, 20 new tokens: auto 29.47, fsdp (FSDP2) 0.967,
    # fsdp-noreshard 28.0 tok/s, with calibrate() on the same host.
    cal = _calibration(CPU_GATHER, 21.86e9, "gloo", "cpu", fresh_copy=4.96e9)
    links = links_from_calibration(cal, "LOOPBACK")
    kwargs = dict(device_type="cpu", dtype_bytes=4, max_new_tokens=20, compute_time_s=1 / 29.47)
    fsdp = predict_for(PRESETS["cpu-110m"], "fsdp", 2, links, **kwargs)
    noreshard = predict_for(PRESETS["cpu-110m"], "fsdp-noreshard", 2, links, **kwargs)
    assert fsdp.implementation.startswith("FSDP2")
    assert fsdp.bound == "all_gather"
    assert abs(_error(fsdp.tokens_per_sec, 0.967)) <= 0.25
    assert abs(_error(noreshard.tokens_per_sec, 28.0)) <= 0.25
    assert fsdp.tokens_per_sec * 20 < noreshard.tokens_per_sec  # the seed's slow-down, on CPU


def test_cpu_reference_table() -> None:
    # measurements.md: replicated 40.2, FSDP2 1.45, no reshard 33.1 tok/s, "all-gather bus
    # bandwidth (64 MiB) 0.16 GB/s". That figure cannot be the link FSDP ran over: 1.45 tok/s
    # moves 235 MB per token per rank, >= 0.35 GB/s. Fed as is, the model is pessimistic by
    # half (never a false failure); the no-reshard row does not depend on it.
    gib64 = 64 << 20
    t = gib64 * bus_factor("all_gather", 2) / 0.16e9
    cal = _calibration(((4096, 0.25e-3), (gib64, t)), 20e9, "gloo", "cpu")
    links = links_from_calibration(cal, "LOOPBACK")
    kwargs = dict(device_type="cpu", dtype_bytes=4, compute_time_s=1 / 40.2)
    fsdp = predict_for(PRESETS["cpu-110m"], "fsdp", 2, links, **kwargs)
    noreshard = predict_for(PRESETS["cpu-110m"], "fsdp-noreshard", 2, links, **kwargs)
    assert 0.3 < fsdp.tokens_per_sec / 1.45 < 1.0
    assert abs(_error(noreshard.tokens_per_sec, 33.1)) <= 0.25


# --------------------------------------------------------------------------- structure


def test_replicated_has_no_collective_terms() -> None:
    for name in ("auto", "ddp"):
        p = predict_for(PRESETS["pythia-2.8b"], name, 4, NVLINK, compute_time_s=0.01)
        assert p.terms == {"compute": 0.01}
        assert p.bound == "compute"
        assert p.collectives_per_token == 0
        assert p.tokens_per_sec == pytest.approx(100.0)


def test_fsdp1_gathers_every_block_but_not_the_root() -> None:
    cfg = PRESETS["pythia-2.8b"]
    p = predict_for(cfg, "fsdp", 2, NVLINK, compute_time_s=0.01)
    block = cfg.block_param_count() * 2
    assert p.implementation == "FSDP1 FULL_SHARD"
    assert p.collectives_per_token == cfg.n_layer
    assert p.bytes_per_token["all_gather_output"] == cfg.n_layer * block
    assert p.bytes_per_token["all_gather_received"] == pytest.approx(cfg.n_layer * block / 2)


def test_fsdp2_also_gathers_the_root_and_pays_copies() -> None:
    cfg = PRESETS["pythia-2.8b"]
    p = predict_for(cfg, "fsdp2", 2, NVLINK, compute_time_s=0.01)
    root = cfg.non_block_param_count() * 2
    assert p.collectives_per_token == cfg.n_layer + 1
    assert (
        p.bytes_per_token["all_gather_output"] == cfg.n_layer * cfg.block_param_count() * 2 + root
    )
    assert p.terms["gather_copies"] > 0


def test_fsdp_is_fsdp2_off_cuda() -> None:
    cpu = predict_for(PRESETS["tiny"], "fsdp", 2, NVLINK, device_type="cpu", compute_time_s=0.01)
    assert cpu.implementation.startswith("FSDP2 reshard_after_forward=True")


def test_noreshard_has_no_per_token_traffic() -> None:
    p = predict_for(PRESETS["llama-2-7b"], "fsdp-noreshard", 2, HOST_STAGED, compute_time_s=0.01)
    assert "all_gather" not in p.terms
    assert p.bytes_per_token["all_gather_received"] == 0
    assert p.terms["fsdp_overhead"] > 0


def test_one_device_pays_the_wrapper_but_moves_nothing() -> None:
    """One FSDP rank gathers from nobody, yet its per-unit hooks still run every forward."""
    cfg = PRESETS["tiny"]
    p = predict_for(cfg, "fsdp", 1, NVLINK, compute_time_s=0.01)
    assert p.terms["all_gather"] == p.terms["latency"] == 0.0
    assert p.terms["fsdp_overhead"] == pytest.approx((cfg.n_layer + 1) * 0.95e-3)
    assert predict_for(cfg, "auto", 1, NVLINK, compute_time_s=0.01).terms == {"compute": 0.01}


def test_the_prefill_beyond_one_step_is_spread_over_the_tokens() -> None:
    cfg = PRESETS["tiny"]
    plain = predict_for(cfg, "auto", 2, NVLINK, compute_time_s=0.01, max_new_tokens=4)
    slow_prefill = predict_for(
        cfg, "auto", 2, NVLINK, compute_time_s=0.01, max_new_tokens=4, prefill_time_s=0.05
    )
    assert slow_prefill.terms["prefill"] == pytest.approx((0.05 - 0.01) / 4)
    # the rate a 4-token generation reaches: 4 tokens over prefill + 3 steps
    assert slow_prefill.tokens_per_sec == pytest.approx(4 / (0.05 + 3 * 0.01))
    assert "prefill" not in plain.terms


@pytest.mark.parametrize("strategy", ["auto", "fsdp", "tp"])
def test_a_step_yields_a_token_for_every_batch_row(strategy: str) -> None:
    # The measured rate counts batch x new tokens; the prediction must count the same, or the
    # threshold of a batch of 4 is four times too lax.
    cfg = PRESETS["tiny"]
    one = predict_for(cfg, strategy, 2, NVLINK, compute_time_s=0.01, batch_size=1)
    four = predict_for(cfg, strategy, 2, NVLINK, compute_time_s=0.01, batch_size=4)
    assert four.tokens_per_sec == pytest.approx(4 / four.time_per_token_s)
    assert one.tokens_per_sec == pytest.approx(1 / one.time_per_token_s)
    assert four.to_dict()["batch_size"] == 4
    assert "per step of 4 rows" in describe_prediction(four)
    assert "/token)" in describe_prediction(one)


def test_collectives_scale_with_the_group_size() -> None:
    cfg = PRESETS["pythia-2.8b"]
    two = predict_for(cfg, "fsdp", 2, NVLINK, compute_time_s=0.01)
    four = predict_for(cfg, "fsdp", 4, NVLINK, compute_time_s=0.01)
    # measured on 2 ranks: 4 ranks receive 3/4 of the weights instead of 1/2
    assert four.terms["all_gather"] == pytest.approx(two.terms["all_gather"] * 1.5)


def test_monotonic_in_bandwidth_and_model_size() -> None:
    topo = load_nvidia_smi_topo(SEED_TOPO)
    rates = []
    for gbps in (2.0, 4.0, 12.0, 50.0, 200.0):
        links = nominal_links(topo, 4, bus_bandwidth=gbps * GB)
        fsdp = predict_for(PRESETS["pythia-2.8b"], "fsdp", 4, links, compute_time_s=0.05)
        auto = predict_for(PRESETS["pythia-2.8b"], "auto", 4, links, compute_time_s=0.05)
        assert auto.tokens_per_sec == pytest.approx(20.0)  # links do not matter when replicated
        rates.append(fsdp.tokens_per_sec)
    assert rates == sorted(rates) and len(set(rates)) == len(rates)
    links = nominal_links(topo, 4)
    sizes = ["pythia-160m", "pythia-1b", "pythia-2.8b", "llama-2-7b"]
    by_size = [predict_for(PRESETS[m], "fsdp", 4, links).tokens_per_sec for m in sizes]
    assert by_size == sorted(by_size, reverse=True)


def test_strategies_order_on_slow_links() -> None:
    links = nominal_links(load_nvidia_smi_topo(SEED_TOPO), 4)
    by = {p.strategy: p for p in predict_all_for(PRESETS["pythia-2.8b"], 4, links)}
    assert by["auto"].tokens_per_sec > by["fsdp-noreshard"].tokens_per_sec
    assert by["fsdp-noreshard"].tokens_per_sec > by["fsdp"].tokens_per_sec
    assert by["fsdp"].tokens_per_sec > by["fsdp2"].tokens_per_sec  # FSDP2 also gathers the root


def test_seed_box_bounds() -> None:
    links = nominal_links(load_nvidia_smi_topo(SEED_TOPO), 4)
    auto = predict_for(PRESETS["pythia-2.8b"], "auto", 4, links)
    fsdp = predict_for(PRESETS["pythia-2.8b"], "fsdp", 4, links)
    assert auto.bound == "weights"
    assert fsdp.bound == "all_gather" and fsdp.link_class == "PHB"
    assert "PHB" in fsdp.bound_description
    # the seed measured 17.30 and 0.77 tok/s: a 22x gap; the nominal model gives ~19x
    assert 10 < auto.tokens_per_sec / fsdp.tokens_per_sec < 40


def test_kv_cache_bytes_grow_with_the_sequence() -> None:
    cfg = PRESETS["llama-2-7b"]
    short = predict_for(cfg, "auto", 1, NVLINK, max_new_tokens=10)
    long = predict_for(cfg, "auto", 1, NVLINK, max_new_tokens=2000)
    assert long.bytes_per_token["kv_read"] > short.bytes_per_token["kv_read"]
    assert long.tokens_per_sec < short.tokens_per_sec


def test_overheads_are_a_parameter() -> None:
    none = Overheads(0.0, 0.0, 0.0, 0.0)
    p = predict_for(PRESETS["pythia-2.8b"], "fsdp", 2, NVLINK, compute_time_s=0.01, overheads=none)
    assert p.terms["fsdp_overhead"] == 0
    default = predict_for(PRESETS["pythia-2.8b"], "fsdp", 2, NVLINK, compute_time_s=0.01)
    assert default.tokens_per_sec < p.tokens_per_sec


def test_bad_inputs_raise_with_the_value() -> None:
    cfg = PRESETS["tiny"]
    with pytest.raises(ValueError, match="unknown strategy 'zero3'; valid: auto"):
        predict_for(cfg, "zero3", 2, NVLINK)
    with pytest.raises(ValueError, match="devices must be >= 1, got 0"):
        predict_for(cfg, "auto", 0, NVLINK)
    with pytest.raises(ValueError, match="compute_time_s must be > 0"):
        predict_for(cfg, "auto", 2, NVLINK, compute_time_s=0.0)
    no_memory = replace(NVLINK, memory_bandwidth=None)
    with pytest.raises(ValueError, match="no memory bandwidth"):
        predict_for(cfg, "auto", 2, no_memory)


# --------------------------------------------------------------------------- calibration values


def test_nccl_tests_conventions() -> None:
    ag = CollectiveFigure.from_time("all_gather", 1_000_000, 0.001, 4)
    ar = CollectiveFigure.from_time("all_reduce", 1_000_000, 0.001, 4)
    assert ag.algbw == pytest.approx(1e9) and ag.busbw == pytest.approx(0.75e9)
    assert ar.algbw == pytest.approx(1e9) and ar.busbw == pytest.approx(1.5e9)
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        bus_factor("broadcast", 2)


def test_interpolation_between_measured_sizes() -> None:
    cal = NVLINK.calibration
    assert cal is not None
    assert cal.time_at("all_gather", 157352960) == pytest.approx(405.5e-6)
    assert cal.time_at("all_gather", 1) == pytest.approx(66.0e-6)  # below: the smallest's time
    mid = cal.time_at("all_gather", (157352960 + 268435456) / 2)
    assert mid == pytest.approx((405.5e-6 + 620.9e-6) / 2)
    # above the largest: its time plus the extra bytes at its algorithm bandwidth
    assert cal.time_at("all_gather", 2 << 30) == pytest.approx(2 * 2100.7e-6)
    assert cal.busbw_at("all_gather", 1 << 30) == pytest.approx(255.6e9, rel=1e-3)


def test_calibration_round_trips_through_json() -> None:
    cal = _calibration(H200_NVLINK_GATHER, H200_COPY, fresh_copy=4.1e12)
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal


def test_calibration_from_dict_names_the_bad_field() -> None:
    good = _calibration(CPU_GATHER, 20e9).to_dict()
    data = json.loads(json.dumps(good))
    data["all_gather"][1]["time_s"] = "fast"
    with pytest.raises(ValueError, match=r"calibration all_gather\[1\]: field 'time_s'"):
        Calibration.from_dict(data)
    with pytest.raises(ValueError, match="missing field 'latency_s'"):
        Calibration.from_dict({k: v for k, v in good.items() if k != "latency_s"})
    with pytest.raises(ValueError, match="expected a JSON object"):
        Calibration.from_dict([1, 2])


# --------------------------------------------------------------------------- verdict text


def _fsdp_cpu_prediction() -> Prediction:
    cal = _calibration(CPU_GATHER, 21.86e9, "gloo", "cpu", fresh_copy=4.96e9)
    links = links_from_calibration(cal, "LOOPBACK")
    return predict_for(
        PRESETS["cpu-110m"],
        "fsdp",
        2,
        links,
        device_type="cpu",
        dtype_bytes=4,
        compute_time_s=0.034,
    )


def test_threshold() -> None:
    p = _fsdp_cpu_prediction()
    assert threshold(p, 1.0) == p.tokens_per_sec
    assert threshold(p, 0.5) == pytest.approx(p.tokens_per_sec / 2)
    for bad in (0.0, -0.1, 1.01, math.nan, True):
        with pytest.raises(ValueError, match="efficiency must be in"):
            threshold(p, bad)


def test_failure_message_names_everything_a_user_needs() -> None:
    p = _fsdp_cpu_prediction()
    text = failure_message(p, measured_tokens_per_sec=0.4, efficiency=0.6)
    assert "fsdp (FSDP2 reshard_after_forward=True) on 2 device(s)" in text
    assert "measured 0.4 tok/s" in text
    assert f"threshold {0.6 * p.tokens_per_sec:.3g} tok/s" in text
    assert f"predicted {p.tokens_per_sec:.3g} tok/s" in text
    assert "bound by all_gather (all-gather traffic over LOOPBACK" in text
    assert "LOOPBACK at measured 0.42 GB/s bus bandwidth" in text
    received = p.bytes_per_token["all_gather_received"] / 1e6
    assert f"{received:.4g} MB received per token per rank in 9 collectives" in text
    assert f"measured/predicted = {0.4 / p.tokens_per_sec:.2f}" in text


def test_prediction_to_dict_is_json() -> None:
    p = _fsdp_cpu_prediction()
    data = json.loads(json.dumps(p.to_dict()))
    assert data["bound"] == "all_gather" and data["link_class"] == "LOOPBACK"
    assert data["terms"]["compute"] == pytest.approx(0.034)


# --------------------------------------------------------------------------- recorded runs

RECORDED = Path(__file__).parent.parent / "docs" / "benchmarks" / "data" / "h200-v2"


@pytest.mark.parametrize("report", ["call1-nvlink.json", "call1-p2p-disabled.json"])
def test_fsdp_rows_of_the_recorded_h200_runs(report: str) -> None:
    # Each sharded row predicted from what its own run recorded (calibration with the measured
    # overlap, single-process reference), as the plugin does: FSDP1 lands within 5% on both
    # models and both paths once the transfer hides behind the host work.
    from distperf_model.config import Config

    from pytest_distperf.spec import PRECISION_BYTES

    results = json.loads((RECORDED / report).read_text())["results"]
    calibration = Calibration.from_dict(next(r["calibration"] for r in results if r["calibration"]))
    assert calibration.overlap > 0.8  # measured: this host hides one path behind the other
    links = links_from_calibration(calibration, "NV18")
    fsdp = [r for r in results if r["strategy"] == "fsdp"]
    assert len(fsdp) == 2
    for r in fsdp:
        w = r["workload"]
        p = predict_for(
            Config.from_name(w["model"]),
            "fsdp",
            r["devices"],
            links,
            batch_size=w["batch_size"],
            prompt_length=w["prompt_length"],
            max_new_tokens=w["max_new_tokens"],
            dtype_bytes=PRECISION_BYTES[w["precision"]],
            compute_time_s=r["reference_token_s"],
        )
        assert abs(_error(p.tokens_per_sec, r["tokens_per_sec"])) <= 0.05, (w["model"], p.terms)
        assert "overlap" in p.terms
