"""The prediction charges the collectives counted in a run's ranks where they differ from what
the strategy's model expects, and says both (perfmodel/step.py)."""

from __future__ import annotations

import pytest
from distperf_model.config import PRESETS
from test_perfmodel import NVLINK

from pytest_distperf.perfmodel.prediction import describe_prediction
from pytest_distperf.strategies import predict_for

CFG = PRESETS["pythia-2.8b"]


def _expected(name: str) -> dict[str, tuple[float, float]]:
    return predict_for(CFG, name, 2, NVLINK, compute_time_s=0.01).expected_collectives


def test_counts_that_match_the_model_leave_the_prediction_as_it_was() -> None:
    plain = predict_for(CFG, "fsdp2", 2, NVLINK, compute_time_s=0.01)
    calls, nbytes = plain.expected_collectives["all_gather"]
    assert calls == CFG.n_layer + 1 and nbytes == plain.bytes_per_token["all_gather_output"]
    counted = predict_for(
        CFG, "fsdp2", 2, NVLINK, compute_time_s=0.01,
        counted_collectives={"all_gather": (calls, nbytes * 1.001)},  # whole elements per rank
    )  # fmt: skip
    assert counted.terms == plain.terms and counted.assumptions == plain.assumptions
    text = describe_prediction(counted)
    assert "collectives per token, predicted: all_gather 33 x " in text
    assert "; counted: all_gather 33 x " in text
    assert "counted" not in describe_prediction(plain)  # not counted: nothing to compare


def test_a_collective_the_model_does_not_expect_is_charged() -> None:
    plain = predict_for(CFG, "auto", 2, NVLINK, compute_time_s=0.01)
    counted = predict_for(
        CFG, "auto", 2, NVLINK, compute_time_s=0.01,
        counted_collectives={"all_reduce": (CFG.n_layer, CFG.n_layer * 64.0)},
    )  # fmt: skip
    assert plain.terms == {"compute": 0.01} and plain.expected_collectives == {}
    assert counted.terms["all_reduce"] >= 0 and counted.terms["latency"] > 0  # latency-bound
    assert counted.tokens_per_sec < plain.tokens_per_sec
    assert counted.collectives_per_token == CFG.n_layer
    assert counted.bytes_per_token["all_reduce_bytes"] == CFG.n_layer * 64.0
    assert (
        "collectives as counted in this run's ranks (all_reduce 32 x 64 B per token), not as "
        "the strategy's model expects (none)"
    ) in counted.assumptions
    assert "predicted: none; counted: all_reduce 32 x 64 B" in describe_prediction(counted)


def test_more_gathers_than_expected_cost_their_time_and_latency() -> None:
    plain = predict_for(CFG, "fsdp", 2, NVLINK, compute_time_s=0.01)  # FSDP1 keeps the root
    calls, nbytes = plain.expected_collectives["all_gather"]
    root = CFG.non_block_param_count() * 2
    counted = predict_for(
        CFG, "fsdp", 2, NVLINK, compute_time_s=0.01,
        counted_collectives={"all_gather": (calls + 1, nbytes + root)},
    )  # fmt: skip
    assert counted.terms["all_gather"] > plain.terms["all_gather"]
    assert counted.terms["latency"] > plain.terms["latency"]
    assert counted.collectives_per_token == calls + 1
    assert counted.bytes_per_token["all_gather_output"] == nbytes + root
    assert counted.bytes_per_token["all_gather_received"] == pytest.approx((nbytes + root) / 2)
    assert counted.terms["fsdp_overhead"] == plain.terms["fsdp_overhead"]


def test_a_pipelines_hops_stay_the_models_own() -> None:
    shape = PRESETS["pythia-14m"]
    plain = predict_for(shape, "pipeline", 2, NVLINK, compute_time_s=0.01)
    assert set(plain.expected_collectives) == {"send/recv"}
    counted = predict_for(
        shape, "pipeline", 2, NVLINK, compute_time_s=0.01,
        counted_collectives={"send": (1.0, 512.0), "recv": (1.0, 8.0)},
    )  # fmt: skip
    assert counted.terms == plain.terms
    assert counted.to_dict()["counted_collectives"] == {
        "recv": {"calls": 1.0, "bytes": 8.0}, "send": {"calls": 1.0, "bytes": 512.0},
    }  # fmt: skip
