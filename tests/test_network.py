"""Multi-node jobs in the pure parts: a calibration's scopes (JSON round trip), the topology's
network, the links of a job over several nodes, and the network term of a prediction."""

from __future__ import annotations

from dataclasses import replace

import pytest
from distperf_model.config import PRESETS

from pytest_distperf.launch.job import LaunchedJob
from pytest_distperf.perfmodel import (
    GB,
    Calibration,
    CollectiveFigure,
    failure_message,
    measured_network,
    run_links,
)
from pytest_distperf.perfmodel.links import NOMINAL_NETWORK_GBPS
from pytest_distperf.perfmodel.prediction import describe_prediction
from pytest_distperf.ranks.calibrate import job_nodes
from pytest_distperf.strategies import predict_for, predict_train_for
from pytest_distperf.topology import Device, Link, Network, Topology

SHAPE = PRESETS["pythia-160m"]
SIZES = (4096, 1 << 20, 64 << 20)
NODE_BW, NODE_LATENCY = 100 * GB, 20e-6  # a node's own links: fast
NET_BW, NET_LATENCY = 1 * GB, 200e-6  # the network between nodes: slow


def _figures(op: str, ranks: int, bandwidth: float, latency: float) -> tuple:
    return tuple(CollectiveFigure.from_time(op, b, latency + b / bandwidth, ranks) for b in SIZES)


def _calibration(ranks: int, bandwidth: float, latency: float, **kwargs) -> Calibration:
    ops = {op: _figures(op, ranks, bandwidth, latency) for op in ("all_gather", "all_reduce")}
    p2p = _figures("p2p", ranks, bandwidth, latency)
    device = {"memory_bandwidth": 4e12, "fresh_copy_bandwidth": 4e12, "overlap": 0.5}
    return Calibration(ranks, "nccl", "cuda", **ops, latency_s=latency, p2p=p2p, **device, **kwargs)


def _job_calibration(nodes: int = 2, per_node: int = 2) -> Calibration:
    inner = _calibration(per_node, NODE_BW, NODE_LATENCY) if per_node > 1 else None
    return _calibration(nodes * per_node, NET_BW, NET_LATENCY, nodes=nodes, within_node=inner)


def _node(per_node: int = 2, nodes: int = 2) -> Topology:
    devices = tuple(Device(i, "NVIDIA H200", 141 << 30) for i in range(per_node))
    links = tuple(Link(a, b, "NV18") for a in range(per_node) for b in range(a + 1, per_node))
    return Topology("cuda", devices, links, "test", nodes=nodes)


# --------------------------------------------------------------------------- calibration


def test_a_job_calibration_round_trips_with_its_scopes() -> None:
    cal = _job_calibration()
    data = cal.to_dict()
    assert (data["nodes"], data["scope"], data["within_node"]["scope"]) == (2, "network", "node")
    assert data["within_node"]["world_size"] == 2 and "nodes" not in data["within_node"]
    assert Calibration.from_dict(data) == cal
    one_per_node = _job_calibration(per_node=1)
    assert one_per_node.to_dict()["within_node"] is None
    assert Calibration.from_dict(one_per_node.to_dict()) == one_per_node


def test_a_single_node_calibration_is_written_as_before() -> None:
    cal = _calibration(2, NODE_BW, NODE_LATENCY)
    assert not {"nodes", "scope", "within_node"} & cal.to_dict().keys()
    assert cal.scope == "node" and Calibration.from_dict(cal.to_dict()) == cal


def test_bad_scopes_are_refused() -> None:
    data = _job_calibration().to_dict()
    with pytest.raises(ValueError, match="unknown scope 'rack'"):
        Calibration.from_dict({**data, "scope": "rack"})
    with pytest.raises(ValueError, match="within_node: scope must be 'node'"):
        Calibration.from_dict({**data, "within_node": {**data["within_node"], "scope": "network"}})
    with pytest.raises(ValueError, match="calibration: nodes must be an integer >= 1, got 0"):
        Calibration.from_dict({**data, "nodes": 0})
    with pytest.raises(ValueError, match="within_node belongs to a job over several nodes"):
        replace(_calibration(2, NODE_BW, NODE_LATENCY), within_node=_job_calibration().within_node)


def test_merging_keeps_both_scopes() -> None:
    cal = _job_calibration()
    extra = CollectiveFigure.from_time("all_gather", 7 << 20, 1e-3, 2)
    inner = cal.within_node
    newer = replace(cal, within_node=replace(inner, all_gather=(*inner.all_gather, extra)))
    merged = cal.merged(newer)
    assert merged.nodes == 2 and 7 << 20 in [f.bytes for f in merged.within_node.all_gather]
    assert replace(cal, within_node=None).merged(cal).within_node == inner


def test_job_nodes_from_torchruns_local_world_size() -> None:
    assert job_nodes(4, {"LOCAL_WORLD_SIZE": "2"}) == 2
    assert job_nodes(2, {"LOCAL_WORLD_SIZE": "1"}) == 2
    assert job_nodes(4, {}) == 1  # the pool's ranks: one host
    assert job_nodes(4, {"LOCAL_WORLD_SIZE": "3"}) == 1
    assert job_nodes(4, {"LOCAL_WORLD_SIZE": "x"}) == 1


# --------------------------------------------------------------------------- topology


def test_the_topology_names_the_network_once_measured() -> None:
    job = LaunchedJob(rank=0, world_size=4, local_world_size=2)
    topology = job.topology(replace(_node(), nodes=1))
    assert topology.nodes == 2 and topology.network.busbw is None
    assert "network between 2 nodes: unknown" in topology.network.describe(2)
    measured = measured_network(topology, _job_calibration())
    assert measured.network.busbw == pytest.approx(_job_calibration().all_gather[-1].busbw)
    assert measured.network.latency_s == NET_LATENCY
    assert "nccl all-gather over 4 ranks, 2 per node" in measured.network.describe(2)
    assert measured.key() == topology.key() == "cuda_nvidia-h200_x2_nv18x1_2nodes"
    assert Topology.from_dict(measured.to_dict()) == measured
    assert measured.to_dict()["network"]["busbw"] == measured.network.busbw
    single = _node(nodes=1)
    assert "network" not in single.to_dict()
    assert measured_network(single, _calibration(2, NODE_BW, NODE_LATENCY)) is single
    assert LaunchedJob(0, 2, 2).topology(single) is single


def test_a_bad_network_in_a_file_is_refused() -> None:
    data = {**_node().to_dict(), "network": {"busbw": "fast"}}
    with pytest.raises(ValueError, match="'busbw' must be a number"):
        Topology.from_dict(data)
    with pytest.raises(ValueError, match="busbw must be >= 0"):
        Network(busbw=-1.0)
    negative = {**_node().to_dict(), "network": {"busbw": -1.0}}
    with pytest.raises(ValueError, match=r"^network: busbw must be >= 0, got -1.0$"):
        Topology.from_dict(negative)


# --------------------------------------------------------------------------- links


def test_collectives_within_a_node_at_its_links_across_nodes_at_the_network() -> None:
    cal = _job_calibration()
    links = run_links(_node(), 4, cal)
    assert (links.nodes, links.ranks_per_node, links.link_class) == (
        2,
        2,
        "network between 2 nodes",
    )
    assert links.node is not None and links.node.link_class == "NV18"
    size = 1 << 20
    within = sum(links.collective_time("all_reduce", size, 2))
    across = sum(links.collective_time("all_reduce", size, 4))
    assert within == pytest.approx(cal.within_node.time_at("all_reduce", size))
    assert across == pytest.approx(cal.time_at("all_reduce", size))
    assert sum(links.hop_time(size, True)) == pytest.approx(cal.time_at("p2p", size))
    assert sum(links.hop_time(size, False)) == pytest.approx(cal.within_node.time_at("p2p", size))
    assert links.hops_across_nodes(4) == 1 and links.crosses_nodes(4)
    assert not links.crosses_nodes(2)


def test_without_a_calibration_the_network_is_a_slow_guess() -> None:
    links = run_links(_node(), 4)
    assert not links.measured and links.busbw == NOMINAL_NETWORK_GBPS * GB
    assert links.node is not None and links.node.link_class == "NV18"
    assert any("not measured; assumed" in a for a in links.assumptions)
    with pytest.raises(ValueError, match="do not split evenly"):
        run_links(_node(), 3)


# --------------------------------------------------------------------------- prediction


@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_collectives_over_all_ranks_are_charged_at_the_network(strategy: str) -> None:
    cal = _job_calibration()
    p = predict_for(SHAPE, strategy, 4, run_links(_node(), 4, cal), compute_time_s=0.01)
    # every collective spans both nodes: all of its time is the network's
    link_terms = {
        k: v for k, v in p.terms.items() if k in ("all_gather", "all_reduce", "latency") and v
    }
    assert p.network is not None and p.network.terms == pytest.approx(link_terms)
    assert p.network.busbw == run_links(_node(), 4, cal).busbw and p.network.measured
    # the same ranks on one node's links: faster, and nothing crosses a network
    one_node = run_links(_node(4, 1), 4, cal.within_node)
    fast = predict_for(SHAPE, strategy, 4, one_node, compute_time_s=0.01)
    assert fast.network is None and p.time_per_token_s > fast.time_per_token_s


def test_pipeline_hops_between_nodes_cross_the_network() -> None:
    cal = _job_calibration()
    links = run_links(_node(), 4, cal)
    p = predict_for(SHAPE, "pipeline", 4, links, compute_time_s=0.01)
    activation, token = SHAPE.n_embd * 2, 8
    node_hop = cal.within_node.time_at("p2p", activation)
    network_hops = cal.time_at("p2p", activation) + cal.time_at("p2p", token)
    assert p.terms["p2p"] + p.terms["latency"] == pytest.approx(2 * node_hop + network_hops)
    assert p.network.seconds == pytest.approx(network_hops)
    assert any("1 of the 3 hop(s) and the token back cross" in a for a in p.assumptions)


def test_the_threshold_message_names_the_network_term() -> None:
    links = run_links(_node(), 4, _job_calibration())
    p = predict_for(SHAPE, "fsdp", 4, links, compute_time_s=0.01)
    message = failure_message(p, p.tokens_per_sec / 2, 0.7)
    assert "network term: " in message and "crosses the network between 2 nodes" in message
    assert f"{p.network.busbw / GB:.3g} GB/s bus bandwidth, 200 us latency" in message
    assert p.to_dict()["network"]["terms"].keys() == p.network.terms.keys()
    auto = predict_for(SHAPE, "auto", 4, links, compute_time_s=0.01)
    assert "network term: none (nothing crosses the network between 2 nodes" in (
        describe_prediction(auto)
    )


def test_a_single_node_prediction_is_unchanged() -> None:
    cal = _calibration(2, NODE_BW, NODE_LATENCY)
    links = run_links(_node(nodes=1), 2, cal)
    for strategy in ("fsdp", "tp", "pipeline"):
        p = predict_for(SHAPE, strategy, 2, links, compute_time_s=0.01)
        assert p.network is None and "network" not in p.to_dict()
        assert "network" not in describe_prediction(p)


def test_a_training_step_names_its_network_term() -> None:
    links = run_links(_node(), 4, _job_calibration())
    args = {"batch_size": 2, "seq_length": 64, "param_bytes": 4, "comm_bytes": 4}
    p = predict_train_for(SHAPE, "ddp", 4, links, device_type="cuda", step_compute_s=0.5, **args)
    assert p.network is not None and set(p.network.terms) == {"grad_all_reduce", "latency"}
    assert "network term: " in describe_prediction(p) and " per step (" in describe_prediction(p)
