"""Link figures: nominal ones from a topology, and the one choice between measured and nominal
that the gate and `distperf predict` share (`run_links`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_distperf.perfmodel import GB, Calibration, CollectiveFigure, run_links
from pytest_distperf.perfmodel import links as pm_links
from pytest_distperf.perfmodel.links import nominal_links
from pytest_distperf.topology import Device, Link, Topology, load_nvidia_smi_topo

DATA = Path(__file__).parent / "data" / "topologies"
SEED_TOPO = DATA / "topo_seed_4x_a10g_phb.txt"
H200_TOPO = DATA / "topo_2x_h200_nv18.txt"


def test_nominal_nvlink_h200() -> None:
    links = nominal_links(load_nvidia_smi_topo(H200_TOPO), 2)
    assert links.link_class == "NV18"
    assert links.busbw == pytest.approx(18 * 26.5625 * pm_links.NVLINK_EFFICIENCY * GB)
    assert any("NVLink 4" in a for a in links.assumptions)


def _pcie_pair(link_class: str, gen: int | None, width: int | None, name: str) -> Topology:
    devices = tuple(
        Device(i, name, 24 << 30, pcie_gen_max=gen, pcie_width_max=width) for i in (0, 1)
    )
    return Topology("cuda", devices, (Link(0, 1, link_class),), "test")


def test_nominal_pcie_uses_generation_width_and_path() -> None:
    carmocca = nominal_links(_pcie_pair("PHB", 3, 4, "NVIDIA A10G"), 2)
    assert carmocca.busbw == pytest.approx(12 / 4 * pm_links.HOST_STAGED_FACTOR * GB)
    switch = nominal_links(_pcie_pair("PIX", 4, 16, "NVIDIA A10G"), 2)
    assert switch.busbw == pytest.approx(24 * GB)
    assert switch.memory_bandwidth == pytest.approx(600 * GB * pm_links.COPY_EFFICIENCY)
    unknown = nominal_links(_pcie_pair("PHB", None, None, "mystery"), 2)
    assert any("assumed Gen4 x16" in a for a in unknown.assumptions)
    assert any("not known" in a for a in unknown.assumptions)


def test_nominal_links_device_count_checked() -> None:
    with pytest.raises(ValueError, match="uses 8 device"):
        nominal_links(load_nvidia_smi_topo(SEED_TOPO), 8)


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        ("NVIDIA A10G", 600),
        ("NVIDIA H200", 4800),
        ("NVIDIA A100-SXM4-80GB", 2039),
        ("NVIDIA A100-SXM4-40GB", 1555),
        ("NVIDIA L40S", 864),
        ("NVIDIA L4", 300),
        ("NVIDIA RTX A5000", 768),
    ],
)
def test_gpu_memory_table(name: str, gbps: float) -> None:
    assert pm_links.gpu_memory_bandwidth(name) == pytest.approx(gbps * GB)


def test_gpu_memory_table_unknown() -> None:
    assert pm_links.gpu_memory_bandwidth("Some Accelerator 9000") is None


def test_nominal_links_assume_no_overlap() -> None:
    links = nominal_links(load_nvidia_smi_topo(SEED_TOPO), 4)
    assert links.overlap == 0.0
    assert any("overlap: none assumed" in a for a in links.assumptions)


def _two_rank_calibration() -> Calibration:
    gather = (CollectiveFigure.from_time("all_gather", 1 << 20, 1e-3, 2),)
    return Calibration(2, "nccl", "cuda", gather, (), 1e12, 1e-3)


def test_run_links_measured_when_calibrated_else_nominal() -> None:
    topo = load_nvidia_smi_topo(H200_TOPO)
    measured = run_links(topo, 2, _two_rank_calibration(), "_nccl-p2p-disable-1")
    assert measured.measured and measured.link_class == "NV18 nccl-p2p-disable-1"
    assert run_links(topo, 1, _two_rank_calibration()).link_class == "none"
    nominal = run_links(topo, 2, bus_bandwidth=7 * GB)
    assert not nominal.measured and nominal.busbw == 7 * GB
    assert nominal == nominal_links(topo, 2, bus_bandwidth=7 * GB)
    with pytest.raises(ValueError, match="uses 3 device"):
        run_links(topo, 3)
