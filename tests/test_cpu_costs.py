"""The cost terms that priced CPU ranks wrong (issue 45): a collective larger than any
calibrated size (training `auto`'s gradient all-reduce), and a small all-reduce between host-run
layers (tp's). Pure: calibrations written by hand, at the sizes the main job measured."""

from __future__ import annotations

import pytest

from pytest_distperf.models import shape_of
from pytest_distperf.perfmodel import Calibration, CollectiveFigure, links_from_calibration
from pytest_distperf.strategies import predict_for, predict_train_for

MS = 1e-3
# A session's calibration on 2 CPU ranks as the main job measured it: all-reduces at the
# activations' sizes only (all latency), all-gathers up to a pythia-14m block.
GATHERS = ((512, 0.366 * MS), (4096, 0.266 * MS), (8192, 0.358 * MS), (793088, 0.601 * MS))
REDUCES = ((512, 0.45 * MS), (4096, 0.453 * MS), (8192, 0.362 * MS))


def _calibration(in_step: float = 0.0, reduces: tuple = REDUCES) -> Calibration:
    return Calibration(
        world_size=2,
        backend="gloo",
        device_type="cpu",
        all_gather=tuple(CollectiveFigure.from_time("all_gather", b, t, 2) for b, t in GATHERS),
        all_reduce=tuple(CollectiveFigure.from_time("all_reduce", b, t, 2) for b, t in reduces),
        memory_bandwidth=15.6e9,
        latency_s=0.266 * MS,
        fresh_copy_bandwidth=15.1e9,
        in_step_latency_s=in_step,
    )


def test_beyond_the_largest_size_the_extra_bytes_go_at_the_best_bus_bandwidth() -> None:
    cal = _calibration()
    # The largest all-gather's bus bandwidth: the links' share, the same for an all-reduce.
    best = 793088 / (0.601 * MS) * (2 - 1) / 2
    assert cal.best_algbw("all_reduce") == pytest.approx(best / 1.0)  # 2(n-1)/n = 1 on 2 ranks
    assert cal.best_algbw("all_gather") == pytest.approx(best * 2)
    size = 28_134_912  # one of DDP's two gradient all-reduces of pythia-14m, as counted
    expected = 0.362 * MS + (size - 8192) / best
    assert cal.time_at("all_reduce", size) == pytest.approx(expected)
    # Not at the largest all-reduce's own rate, which is all latency: nearly 30 times slower.
    assert cal.time_at("all_reduce", size) < size / cal.all_reduce[-1].algbw / 25
    # A largest size that is bandwidth-bound keeps its own (faster) rate.
    fast = _calibration(reduces=((4096, 0.45 * MS), (26_214_400, 20 * MS)))
    own = fast.all_reduce[-1].algbw
    assert fast.time_at("all_reduce", size) == pytest.approx(20 * MS + (size - 26_214_400) / own)


def test_training_auto_on_cpu_ranks_is_priced_near_its_measured_rate() -> None:
    # The main job's training `auto` (pythia-14m, 2 x 32 tokens a rank): 776 tok/s measured,
    # the whole model's step 117.5 ms; DDP all-reduced the gradients in 2 calls of 28.1 MB.
    shape = shape_of("pythia-14m")
    assert shape is not None
    links = links_from_calibration(_calibration(), "LOOPBACK")
    prediction = predict_train_for(
        shape,
        "auto",
        2,
        links,
        device_type="cpu",
        batch_size=2,
        seq_length=32,
        param_bytes=4,
        comm_bytes=4,
        step_compute_s=117.5 * MS,
        counted_collectives={"all_reduce": (2, 2 * 28_134_912)},
    )
    # Was 49 tok/s: the gradients priced at a 8 kB all-reduce's rate.
    assert 776 / 1.25 <= prediction.tokens_per_sec <= 776 / 0.8


def _tp(in_step: float, own: float | None = None) -> tuple[float, dict[str, float]]:
    shape = shape_of("pythia-14m")
    assert shape is not None
    links = links_from_calibration(_calibration(in_step), "LOOPBACK")
    prediction = predict_for(
        shape,
        "tp",
        2,
        links,
        device_type="cpu",
        prompt_length=8,
        max_new_tokens=16,
        dtype_bytes=4,
        compute_time_s=3.9 * MS,
        prefill_time_s=3.9 * MS,
        collective_in_step_s=own,
    )
    return prediction.time_per_token_s, prediction.terms


def test_a_small_all_reduce_between_host_run_layers_costs_its_in_step_latency() -> None:
    # tp on 2 CPU ranks: 12 all-reduces a token, each after the ranks drifted apart.
    # Fenced, a 512 B all-reduce is its own smallest call's time, all of it latency.
    fenced_s, fenced = _tp(in_step=0.0)
    assert fenced["latency"] == pytest.approx(12 * 0.45 * MS) and not fenced["all_reduce"]
    in_step_s, terms = _tp(in_step=1.2 * MS)
    assert terms["latency"] == pytest.approx(12 * 1.2 * MS)
    # The in-step figure includes the call: nothing of the fenced call is added as transfer.
    assert not terms["all_reduce"]
    assert in_step_s - fenced_s == pytest.approx(12 * (1.2 - 0.45) * MS)
    # The run: 19.0 ms a token measured; priced at 7.8 ms with the fenced figure.
    assert 0.8 <= 19.0 * MS / in_step_s <= 1.25
    # An in-step figure below the fenced one never lowers a call's price.
    assert _tp(in_step=0.1 * MS)[1]["latency"] == pytest.approx(12 * 0.45 * MS)


def test_the_in_step_latency_is_kept_with_the_calibration_and_said() -> None:
    cal = _calibration(in_step=0.9 * MS)
    assert Calibration.from_dict(cal.to_dict()) == cal
    older = {k: v for k, v in cal.to_dict().items() if k != "in_step_latency_s"}
    assert Calibration.from_dict(older).in_step_latency_s == 0.0  # not measured
    assert _calibration().merged(cal).in_step_latency_s == 0.9 * MS
    notes = links_from_calibration(cal, "LOOPBACK").assumptions
    assert any("900 us a call" in note and "266 us" in note for note in notes)


def test_the_runs_own_in_step_all_reduce_prices_each_call_at_least_that() -> None:
    # tp's all-reduces timed between the whole model's layers in the ranks (ranks/collectives.py)
    assert _tp(in_step=0.0, own=1.2 * MS)[1]["latency"] == pytest.approx(12 * 1.2 * MS)
    # the larger of the calibration's probe and the run's own figure
    assert _tp(in_step=0.9 * MS, own=0.5 * MS)[1]["latency"] == pytest.approx(12 * 0.9 * MS)
    assert _tp(in_step=0.0, own=0.0) == _tp(in_step=0.0)  # not measured: as calibrated


def test_the_in_step_all_reduce_is_the_excess_of_steps_with_it_over_steps_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ranks/collectives.py with the group faked: a step with an all-reduce after each of the two
    # points takes 0.7 s of decode over 7 steps, one without 0.5 s.
    import torch

    from pytest_distperf.measured import Sample
    from pytest_distperf.ranks import collectives

    points = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    summed: list[int] = []
    monkeypatch.setattr(collectives.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(collectives.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(collectives.dist, "all_reduce", lambda tensor: summed.append(1))

    def generation(module, prompt, steps, fences, generate=None):  # type: ignore[no-untyped-def]
        for point in points:  # a forward through both points: their hooks sum, if any
            for hook in point._forward_hooks.values():
                hook(point, (), torch.zeros(2))
        hooked = bool(points[0]._forward_hooks)
        return Sample(total_s=1.0, ttft_s=0.1, decode_s=0.7 if hooked else 0.5), None

    monkeypatch.setattr(collectives, "timed_generation", generation)
    seconds = collectives.in_step_seconds(None, lambda module: points, None, 8, lambda: None)
    assert seconds == pytest.approx((0.7 - 0.5) / 7 / 2)
    assert len(summed) == 2 * (1 + collectives.PAIRS)  # the untimed one, then each pair's
    assert not any(point._forward_hooks for point in points)  # the model is left as it was

    def no_points(module: object) -> list[torch.nn.Module]:
        raise TypeError("a builder's own layout")

    assert collectives.in_step_seconds(None, no_points, None, 8, lambda: None) is None
    monkeypatch.setattr(collectives.dist, "get_world_size", lambda: 1)
    assert collectives.in_step_seconds(None, lambda module: points, None, 8, lambda: None) is None
