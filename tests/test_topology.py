from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from topology_cases import DATA, classes, h200_pair, read

from pytest_distperf.topology import (
    Device,
    Link,
    Topology,
    load_nvidia_smi_topo,
    load_topology,
    parse_nvidia_smi_topo,
    probe_cpu,
)
from pytest_distperf.topology.model import TopologyFileError, TopologyParseError, link_rank

TOPO_FILES = sorted(p for p in DATA.glob("topo_*.txt") if not p.name.endswith(".source.txt"))
OTHER_FILES = sorted(
    p
    for pattern in ("nccl_info_*.txt", "smi_q_*.txt", "rocm_smi_*.txt")
    for p in DATA.glob(pattern)
    if not p.name.endswith(".source.txt")
)


# --------------------------------------------------------------------------- real topo -m outputs


@dataclass(frozen=True)
class Expect:
    count: int
    pairs: dict[tuple[int, int], str]
    census: dict[str, int]
    slowest: str


# Facts read off each file and its .source.txt.
EXPECT = {
    # The seed issue's box: 4x A10G, every pair through the host bridge.
    "topo_seed_4x_a10g_phb.txt": Expect(4, {(0, 1): "PHB", (2, 3): "PHB"}, {"PHB": 6}, "PHB"),
    # The measured 2x H200: 18 NVLinks (through NVSwitch), tabs, empty CPU-affinity cell.
    "topo_2x_h200_nv18.txt": Expect(2, {(0, 1): "NV18"}, {"NV18": 1}, "NV18"),
    # The same box with nvidia-smi's ANSI underline kept.
    "topo_2x_h200_nv18_ansi.txt": Expect(2, {(0, 1): "NV18"}, {"NV18": 1}, "NV18"),
    # Space-aligned, NIC rows/columns and NIC legend, GPU NUMA ID column.
    "topo_2x_rtx6000ada_threadripper_phb_spaces.txt": Expect(2, {(0, 1): "PHB"}, {"PHB": 1}, "PHB"),
    # Two PCIe switches of 4 GPUs each, joined through the host bridge.
    "topo_8x_p100_pcie_pix_phb.txt": Expect(
        8,
        {(0, 1): "PIX", (0, 4): "PHB", (3, 4): "PHB", (4, 7): "PIX"},
        {"PIX": 12, "PHB": 16},
        "PHB",
    ),
    # DGX-1 hybrid cube mesh: NV1/NV2 pairs, SYS where no NVLink; mlx5 columns; old legend.
    "topo_dgx1_v100_8x_nv1_nv2_mlx5_oldlegend.txt": Expect(
        8,
        {(0, 1): "NV1", (0, 3): "NV2", (0, 4): "NV2", (0, 5): "SYS", (3, 7): "NV1", (1, 5): "NV2"},
        {"NV1": 8, "NV2": 8, "SYS": 12},
        "SYS",
    ),
    # DGX A100: NVSwitch, NV12 for every pair; twelve mlx5 columns.
    "topo_dgx_a100_8x_nv12_mlx5.txt": Expect(
        8, {(0, 7): "NV12", (3, 5): "NV12"}, {"NV12": 28}, "NV12"
    ),
}


def test_every_topo_fixture_has_expectations() -> None:
    assert {p.name for p in TOPO_FILES} == set(EXPECT)


@pytest.mark.parametrize("path", TOPO_FILES, ids=lambda p: p.stem)
def test_parse_real_outputs(path: Path) -> None:
    expect = EXPECT[path.name]
    t = parse_nvidia_smi_topo(path.read_text(encoding="utf-8"))
    assert t.accelerator == "cuda"
    assert t.source == "nvidia-smi"
    assert t.device_count == expect.count
    assert t.indices == tuple(range(expect.count))
    assert t.device_model == "unknown"
    for (a, b), cls in expect.pairs.items():
        assert t.link(a, b).link_class == cls
        assert t.link(b, a) == t.link(a, b)
    assert classes(t) == Counter(expect.census)
    assert t.slowest_link().link_class == expect.slowest
    assert t.notes == ()
    # matrix() is readable by the same parser and says the same thing.
    assert parse_nvidia_smi_topo(t.matrix()).links == t.links


def test_nvlink_details_from_parse() -> None:
    t = parse_nvidia_smi_topo(read("topo_2x_h200_nv18.txt"))
    link = t.link(0, 1)
    assert link.is_nvlink and link.nvlinks == 18
    assert link.nvlink_version is None and link.p2p_supported is None
    assert not parse_nvidia_smi_topo(read("topo_seed_4x_a10g_phb.txt")).link(0, 1).is_nvlink


def test_dgx1_slowest_pair_is_a_sys_pair() -> None:
    t = parse_nvidia_smi_topo(read("topo_dgx1_v100_8x_nv1_nv2_mlx5_oldlegend.txt"))
    assert (t.slowest_link().a, t.slowest_link().b) == (0, 5)  # first SYS pair, stable choice


@pytest.mark.parametrize("path", OTHER_FILES, ids=lambda p: p.stem)
def test_other_tools_outputs_are_rejected(path: Path) -> None:
    with pytest.raises(TopologyParseError):
        parse_nvidia_smi_topo(path.read_text(encoding="utf-8"))


def test_rejection_messages_say_what_was_wrong() -> None:
    with pytest.raises(TopologyParseError, match="no GPU header line"):
        parse_nvidia_smi_topo(read("nccl_info_8x_rtx4090_pcie_shm_direct.txt"))
    with pytest.raises(TopologyParseError, match="rocm-smi"):
        parse_nvidia_smi_topo(read("rocm_smi_showtopo_4x_mi210_xgmi.txt"))
    with pytest.raises(TopologyParseError, match="no GPU header line"):
        parse_nvidia_smi_topo("")


SEED = read("topo_seed_4x_a10g_phb.txt")


def test_parse_without_legend_and_with_crlf() -> None:
    body = SEED.split("Legend")[0].rstrip()
    t = parse_nvidia_smi_topo(body.replace("\n", "\r\n"))
    assert classes(t) == Counter({"PHB": 6})


def test_parse_header_stripped_of_leading_whitespace() -> None:
    t = parse_nvidia_smi_topo(SEED.lstrip())
    assert t.device_count == 4


def test_parse_single_gpu() -> None:
    t = parse_nvidia_smi_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n")
    assert t.device_count == 1 and t.links == ()
    with pytest.raises(ValueError, match="no links"):
        t.slowest_link()


def test_parse_unknown_token() -> None:
    text = SEED.replace("GPU1    PHB      X      PHB", "GPU1    PHB      X      XYZ")
    with pytest.raises(TopologyParseError, match=r"row GPU1 column GPU2: unknown link token 'XYZ'"):
        parse_nvidia_smi_topo(text)


def test_parse_row_length_mismatch() -> None:
    text = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\nGPU0\t X \tPHB\nGPU1\tPHB\t X \tPHB\n"
    with pytest.raises(TopologyParseError, match="row GPU0 has 2 link cells but the header names"):
        parse_nvidia_smi_topo(text)


def test_parse_header_without_rows() -> None:
    with pytest.raises(TopologyParseError, match="no GPU rows"):
        parse_nvidia_smi_topo("\tGPU0\tGPU1\tCPU Affinity\n\nLegend:\n")


def test_parse_missing_diagonal() -> None:
    text = "\tGPU0\tGPU1\nGPU0\tPHB\tPHB\nGPU1\tPHB\t X \n"
    with pytest.raises(TopologyParseError, match="expected X on the diagonal"):
        parse_nvidia_smi_topo(text)


def test_parse_old_soc_word_and_asymmetry() -> None:
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tSOC\tPIX\nGPU1\tSOC\t X \tPHB\nGPU2\tPHB\tPHB\t X \n"
    t = parse_nvidia_smi_topo(text)
    assert t.link(0, 1).link_class == "SYS"
    assert t.link(0, 2).link_class == "PHB"  # printed PIX one way, PHB the other: slower wins
    assert any("SOC" in n for n in t.notes)
    assert any("GPU0-GPU2" in n for n in t.notes)


# --------------------------------------------------------------------------- values


def test_link_is_undirected_and_checked() -> None:
    assert Link(3, 1, "PHB") == Link(1, 3, "PHB")
    assert Link(0, 1, "NV12").nvlinks == 12
    with pytest.raises(ValueError, match="unknown link class 'FOO'"):
        Link(0, 1, "FOO")
    with pytest.raises(ValueError, match="NV4 link says it has 2"):
        Link(0, 1, "NV4", nvlinks=2)
    with pytest.raises(ValueError, match="twice"):
        Link(1, 1, "PHB")


def test_topology_requires_every_pair_once() -> None:
    devices = tuple(Device(i, "x", 0) for i in range(3))
    with pytest.raises(ValueError, match=r"missing \[\(1, 2\)\]"):
        Topology("cuda", devices, (Link(0, 1, "PHB"), Link(0, 2, "PHB")), "nvml")


def test_link_lookup_errors() -> None:
    t = h200_pair()
    with pytest.raises(ValueError, match="itself"):
        t.link(1, 1)
    with pytest.raises(KeyError, match="no link between devices 0 and 5"):
        t.link(0, 5)


def test_slowest_link_order() -> None:
    ranks = [link_rank(c) for c in ("NV18", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS")]
    assert ranks == sorted(ranks, reverse=True)
    assert link_rank("unknown") < link_rank("SYS")
    devices = tuple(Device(i, "x", 0) for i in range(3))
    t = Topology(
        "cuda",
        devices,
        (Link(0, 1, "NV2"), Link(0, 2, "NODE"), Link(1, 2, "PXB")),
        "nvml",
    )
    assert t.slowest_link() == Link(0, 2, "NODE")
    assert probe_cpu(3).slowest_link().link_class == "LOOPBACK"


def test_device_model() -> None:
    assert h200_pair().device_model == "NVIDIA H200"
    mixed = Topology("cuda", (Device(0, "A", 0), Device(1, "B", 0)), (Link(0, 1, "PHB"),), "nvml")
    assert mixed.device_model == "mixed"


def test_key_is_stable_and_ignores_incidentals() -> None:
    t = h200_pair()
    assert t.key() == "cuda_nvidia-h200_x2_nv18x1"
    assert re.fullmatch(r"[a-z0-9._-]+", t.key())
    # Same machine seen another day: other bus ids, PCIe dropped to gen 1 at idle, other notes,
    # other host CPU count, loaded from another source.
    other = replace(
        h200_pair(bus_id="00000000:9A:00.0", pcie_gen_current=1),
        notes=("probed on host-b",),
        source="nvidia-smi",
        host_cpus=64,
    )
    assert other.key() == t.key()
    # Link order does not matter.
    a = parse_nvidia_smi_topo(read("topo_8x_p100_pcie_pix_phb.txt"))
    b = replace(a, links=tuple(reversed(a.links)))
    assert a.key() == b.key() == "cuda_unknown_x8_pixx12_phbx16"


def test_key_changes_with_what_matters() -> None:
    base = h200_pair()
    pcie = replace(base, links=(Link(0, 1, "PHB"),))
    renamed = h200_pair(name="NVIDIA H100 80GB HBM3")
    keys = {base.key(), pcie.key(), renamed.key()}
    assert len(keys) == 3
    dgx1 = parse_nvidia_smi_topo(read("topo_dgx1_v100_8x_nv1_nv2_mlx5_oldlegend.txt"))
    dgxa = parse_nvidia_smi_topo(read("topo_dgx_a100_8x_nv12_mlx5.txt"))
    assert dgx1.key() != dgxa.key()
    assert dgx1.key() == "cuda_unknown_x8_nv2x8_nv1x8_sysx12"


def test_cpu_key_counts_usable_cpus() -> None:
    t = probe_cpu(2)
    assert t.key().startswith("cpu_") and t.key().endswith(f"_x2_loopbackx1_{t.host_cpus}cpus")
    assert replace(t, host_cpus=t.host_cpus + 1).key() != t.key()


def test_a_multi_node_key_names_its_nodes_and_a_single_node_key_stays() -> None:
    single = h200_pair()
    assert single.nodes == 1 and single.key() == "cuda_nvidia-h200_x2_nv18x1"
    assert "nodes" not in single.to_dict()  # a single node's saved topology, as before
    two = replace(single, nodes=2)
    assert two.key() == "cuda_nvidia-h200_x2_nv18x1_2nodes"
    assert two.to_dict()["nodes"] == 2 and Topology.from_dict(two.to_dict()) == two
    cpu = probe_cpu(2)
    assert replace(cpu, nodes=3).key() == f"{cpu.key()}_3nodes"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="nodes must be an integer >= 1"):
            replace(single, nodes=bad)


def test_to_dict_round_trip() -> None:
    for t in (
        h200_pair(),
        probe_cpu(3),
        parse_nvidia_smi_topo(read("topo_dgx1_v100_8x_nv1_nv2_mlx5_oldlegend.txt")),
    ):
        data = json.loads(json.dumps(t.to_dict()))
        assert data["schema"] == 1
        assert data["key"] == t.key()
        assert Topology.from_dict(data) == t


def test_matrix_looks_like_nvidia_smi() -> None:
    lines = h200_pair().matrix().splitlines()
    assert lines[0].split() == ["GPU0", "GPU1"]
    assert lines[1].split() == ["GPU0", "X", "NV18"]
    assert lines[2].split() == ["GPU1", "NV18", "X"]


# --------------------------------------------------------------------------- files


def write_json(tmp_path: Path, data: Any, name: str = "topo.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_load_topology(tmp_path: Path) -> None:
    t = h200_pair()
    path = write_json(tmp_path, t.to_dict())
    loaded = load_topology(path, expected_devices=2)
    assert loaded.links == t.links and loaded.devices == t.devices
    assert loaded.source == f"file:{path}"
    assert loaded.key() == t.key()
    assert any("first probed via nvml" in n for n in loaded.notes)


def test_load_topology_missing(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(TopologyFileError, match=rf"{re.escape(str(path))} does not exist"):
        load_topology(path)


def test_load_topology_not_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(TopologyFileError, match=rf"{re.escape(str(path))} is not JSON"):
        load_topology(path)


def test_load_topology_unreadable(tmp_path: Path) -> None:
    with pytest.raises(TopologyFileError, match="is a directory"):
        load_topology(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("schema"), "no 'schema' field"),
        (lambda d: d.update(schema=2), "schema 2 is not supported"),
        (lambda d: d.update(devices="two"), "field 'devices' must be a list"),
        (lambda d: d["devices"][0].pop("name"), r"devices\[0\]: missing field 'name'"),
        (lambda d: d["devices"][1].update(memory_bytes=True), "'memory_bytes' must be an integer"),
        (lambda d: d["links"][0].update(link_class="FAST"), "unknown link class 'FAST'"),
        (lambda d: d.update(links=[]), "links must join every pair"),
    ],
)
def test_load_topology_wrong_shape(tmp_path: Path, change: Any, message: str) -> None:
    data = h200_pair().to_dict()
    change(data)
    path = write_json(tmp_path, data)
    with pytest.raises(TopologyFileError, match=message) as info:
        load_topology(path)
    assert str(path) in str(info.value) and "wrong shape" in str(info.value)


def test_load_topology_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(TopologyFileError, match="expected a JSON object, got list"):
        load_topology(write_json(tmp_path, [1, 2]))


def test_load_topology_too_few_devices(tmp_path: Path) -> None:
    path = write_json(tmp_path, h200_pair().to_dict())
    with pytest.raises(TopologyFileError, match="describes 2 devices but the run uses 4") as info:
        load_topology(path, expected_devices=4)
    assert str(path) in str(info.value)


def test_load_topology_more_devices_keeps_the_first(tmp_path: Path) -> None:
    dgx = parse_nvidia_smi_topo(read("topo_dgx1_v100_8x_nv1_nv2_mlx5_oldlegend.txt"))
    loaded = load_topology(write_json(tmp_path, dgx.to_dict()), expected_devices=4)
    assert loaded.indices == (0, 1, 2, 3)
    assert classes(loaded) == Counter({"NV1": 3, "NV2": 3})
    assert any("describes 8 devices; the run uses 4" in n for n in loaded.notes)


def test_load_nvidia_smi_topo() -> None:
    path = DATA / "topo_dgx_a100_8x_nv12_mlx5.txt"
    t = load_nvidia_smi_topo(path, expected_devices=8)
    assert t.source == f"nvidia-smi-topo:{path}"
    assert classes(t) == Counter({"NV12": 28})
    assert load_nvidia_smi_topo(path, expected_devices=2).device_count == 2
    with pytest.raises(TopologyFileError, match="describes 2 devices but the run uses 4"):
        load_nvidia_smi_topo(DATA / "topo_2x_h200_nv18.txt", expected_devices=4)


def test_load_nvidia_smi_topo_wrong_file(tmp_path: Path) -> None:
    path = DATA / "smi_q_h100_sxm_gen5_x16_linkinfo.txt"
    with pytest.raises(TopologyFileError, match="is not `nvidia-smi topo -m` output") as info:
        load_nvidia_smi_topo(path)
    assert str(path) in str(info.value)
    with pytest.raises(TopologyFileError, match="does not exist"):
        load_nvidia_smi_topo(tmp_path / "topo.txt")


# --------------------------------------------------------------------------- NVML (faked)
