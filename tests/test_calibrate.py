"""calibrate(): conventions and agreement in two real gloo ranks on CPU (slow); its pure parts."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from distperf_model.config import PRESETS
from helpers import spawn_gloo_ranks

from pytest_distperf.perfmodel import Calibration
from pytest_distperf.perfmodel.calibration import bus_factor
from pytest_distperf.ranks.calibrate import calibrate
from pytest_distperf.ranks.probes import (
    OVERLAP_PROBE_MAX_S,
    Timer,
    median_time,
    overlap_fraction,
    probe_index,
)
from pytest_distperf.strategies import message_sizes_for

WORLD = 2
ODD_SIZE = 1001  # not a whole number of fp32 elements per rank: rounded up to 1008 bytes


def _calibrate_in_rank(rank: int, world: int) -> tuple[Any, ...]:
    """One rank: the cpu-110m calibration the plugin would run, then an odd size and bad args."""
    sizes = message_sizes_for(PRESETS["cpu-110m"], ["auto", "fsdp", "pipeline"], world, 4, 1)
    full = calibrate(
        sizes.all_gather,
        sizes.all_reduce,
        "cpu",
        torch.float32,
        1,
        3,
        64 << 20,
        sizes_p2p=sizes.p2p,
    )
    odd = calibrate([ODD_SIZE], [ODD_SIZE], "cpu", torch.float32, 0, 1, 1 << 20)
    try:
        calibrate([4096], [], "cpu", torch.float32, warmup=0, iters=0)
    except ValueError as exc:
        bad = str(exc)
    else:
        bad = ""
    try:  # two ranks as three nodes
        calibrate([4096], [], "cpu", torch.float32, warmup=0, iters=1, nodes=3)
    except ValueError as exc:
        uneven = str(exc)
    else:
        uneven = ""
    return full.to_dict(), odd.to_dict(), bad, uneven


@pytest.fixture(scope="module")
def ranks() -> dict[int, tuple[Any, ...]]:
    return spawn_gloo_ranks(_calibrate_in_rank, WORLD, timeout=60)


@pytest.mark.slow  # two gloo ranks
def test_every_rank_returns_the_same_figures(ranks: dict[int, tuple[Any, ...]]) -> None:
    assert ranks[0][0] == ranks[1][0]
    assert ranks[0][1] == ranks[1][1]


@pytest.mark.slow  # two gloo ranks
def test_calibration_is_complete_and_follows_nccl_tests(ranks: dict[int, tuple[Any, ...]]) -> None:
    cal = Calibration.from_dict(ranks[0][0])
    cfg = PRESETS["cpu-110m"]
    assert (cal.world_size, cal.backend, cal.device_type) == (WORLD, "gloo", "cpu")
    gathered = [f.bytes for f in cal.all_gather]
    assert cfg.block_param_count() * 4 in gathered
    assert cfg.non_block_param_count() * 4 in gathered
    for f in cal.all_gather:
        assert f.time_s > 0
        assert f.algbw == pytest.approx(f.bytes / f.time_s)
        assert f.busbw == pytest.approx(f.algbw * bus_factor("all_gather", WORLD))
    for f in cal.all_reduce:
        assert f.busbw == pytest.approx(f.algbw * bus_factor("all_reduce", WORLD))
    assert cal.latency_s == min(f.time_s for f in cal.all_gather)
    assert cal.memory_bandwidth > 0 and cal.fresh_copy_bandwidth > 0
    assert 0.0 <= cal.overlap <= 1.0
    # CPU ranks run their layers on the host: a small all-reduce between bursts of it is timed
    assert cal.in_step_latency_s > 0
    # a block's gather moves megabytes: it must take longer than the latency probe
    assert cal.time_at("all_gather", cfg.block_param_count() * 4) > cal.latency_s
    # pipeline's hops: the token (8 B) and the activation (n_embd fp32), nccl-tests' sendrecv
    assert [f.bytes for f in cal.p2p] == [8, cfg.n_embd * 4]
    for f in cal.p2p:
        assert f.time_s > 0 and f.busbw == pytest.approx(f.algbw)


@pytest.mark.slow  # two gloo ranks
def test_sizes_round_up_to_whole_elements(ranks: dict[int, tuple[Any, ...]]) -> None:
    odd = Calibration.from_dict(ranks[0][1])
    assert [f.bytes for f in odd.all_gather] == [1008]  # 126 fp32 elements per rank x 2
    assert [f.bytes for f in odd.all_reduce] == [1004]  # 251 fp32 elements


@pytest.mark.slow  # two gloo ranks
def test_bad_repeats_are_refused(ranks: dict[int, tuple[Any, ...]]) -> None:
    assert "iters >= 1" in ranks[0][2]


@pytest.mark.slow  # two gloo ranks
def test_ranks_that_do_not_split_over_the_nodes_are_refused(
    ranks: dict[int, tuple[Any, ...]],
) -> None:
    assert ranks[0][3] == ranks[1][3] == "2 ranks cannot be placed evenly on 3 node(s)"


def test_needs_a_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # pragma: no cover - the test process never joins a group
        pytest.skip("a process group exists in the test process")
    with pytest.raises(RuntimeError, match="initialised torch.distributed process group"):
        calibrate([4096], [4096], "cpu", torch.float32)


@pytest.mark.parametrize(
    ("transfer", "host", "both", "expected"),
    [
        (10.0, 4.0, 10.0, 1.0),  # the host work hid entirely behind the transfer
        (10.0, 4.0, 14.0, 0.0),  # they added up
        (10.0, 4.0, 12.0, 0.5),
        (10.0, 4.0, 16.0, 0.0),  # slowed each other: nothing hidden, never negative
        (10.0, 4.0, 9.0, 1.0),  # timing noise below the longer one: capped at 1
        (0.0, 4.0, 4.0, 0.0),  # nothing to hide
    ],
)
def test_overlap_fraction(transfer: float, host: float, both: float, expected: float) -> None:
    assert overlap_fraction(transfer, host, both) == pytest.approx(expected)


@pytest.mark.parametrize(("slow_call_s", "calls"), [(60.0, 2 + 5), (0.001, 2 + 1)])
def test_a_slow_call_is_timed_once_after_its_warm_up(slow_call_s: float, calls: int) -> None:
    made: list[float] = []
    agreed: list[float] = []

    def op() -> None:
        made.append(time.perf_counter())
        time.sleep(0.002)  # a call of at least this long: slow against 0.001 s, not against 60

    def agree(seconds: float) -> float:  # one rank: its own figure is every rank's
        agreed.append(seconds)
        return seconds

    timer = Timer(sync=lambda: None, barrier=lambda: None, agree=agree)
    median = median_time(op, timer, 2, 5, slow_call_s=slow_call_s)
    assert len(made) == calls
    assert len(agreed) == 1 and agreed[0] >= 0.002  # the last warm-up call, asked once
    assert median >= 0.002


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ((0.001, 0.01, 0.1), 2),  # all quick (a GPU): the largest size
        ((0.001, 0.1, 0.9, 2.0), 1),  # the largest that stays quick
        ((1.0, 0.9, 2.0), 1),  # none quick: the fastest
    ],
)
def test_the_overlap_probe_uses_the_largest_quick_all_gather(
    times: tuple[float, ...], expected: int
) -> None:
    assert OVERLAP_PROBE_MAX_S < 0.9  # the cases above straddle it
    assert probe_index(times) == expected
