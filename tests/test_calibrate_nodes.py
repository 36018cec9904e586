"""calibrate() in a job over several nodes: four real gloo ranks placed as two nodes of two,
each node's pair measured on its own subgroup beside the whole job's figures (slow)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import spawn_gloo_ranks

from pytest_distperf.perfmodel import Calibration
from pytest_distperf.ranks.calibrate import calibrate

WORLD = 4
SIZES = (4096, 64 << 10)


def _calibrate_as_nodes(rank: int, world: int) -> tuple[Any, ...]:
    """Two nodes of two ranks, then four nodes of one: every rank's calibrations as JSON."""
    args = (SIZES, SIZES, "cpu", torch.float32, 1, 2, 1 << 20)
    pairs = calibrate(*args, sizes_p2p=SIZES, nodes=2)
    singles = calibrate(*args, nodes=4)
    return pairs.to_dict(), singles.to_dict()


@pytest.fixture(scope="module")
def ranks() -> dict[int, tuple[Any, ...]]:
    return spawn_gloo_ranks(_calibrate_as_nodes, WORLD, timeout=120)


@pytest.mark.slow  # four gloo ranks
def test_every_rank_returns_both_scopes_alike(ranks: dict[int, tuple[Any, ...]]) -> None:
    assert all(ranks[rank] == ranks[0] for rank in range(WORLD))
    pairs = Calibration.from_dict(ranks[0][0])
    assert (pairs.nodes, pairs.world_size, pairs.scope) == (2, WORLD, "network")
    inner = pairs.within_node
    assert inner is not None and (inner.world_size, inner.scope) == (2, "node")
    for cal in (pairs, inner):
        for op in ("all_gather", "all_reduce", "p2p"):
            assert [f.bytes for f in cal.figures(op)] == list(SIZES)
            assert all(f.time_s > 0 for f in cal.figures(op))
    assert inner.latency_s == min(f.time_s for f in inner.all_gather)
    assert inner.memory_bandwidth == pairs.memory_bandwidth  # the device's, measured once


@pytest.mark.slow  # four gloo ranks
def test_one_rank_per_node_measures_only_the_network(ranks: dict[int, tuple[Any, ...]]) -> None:
    singles = Calibration.from_dict(ranks[0][1])
    assert (singles.nodes, singles.within_node) == (4, None)
    assert singles.to_dict()["scope"] == "network" and not singles.p2p
