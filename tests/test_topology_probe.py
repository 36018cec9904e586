"""Probing a machine's topology: NVML (faked), its failures, CPU hosts."""

from __future__ import annotations

import subprocess
import sys
import types
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from topology_cases import classes, h200_pair

from pytest_distperf import topology as topo
from pytest_distperf.topology import Topology, host, probe, probe_cpu, probe_nvml
from pytest_distperf.topology.nvml import resolve_visible_devices


class FakeNVMLError(Exception):
    _names = {2: "Invalid Argument", 3: "Not Supported", 12: "NVML Shared Library Not Found"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._names.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGPU:
    name: str
    uuid: str
    bus: str
    # One entry per NVLink: (active, remote bus id, remote device type, NVML version enum).
    nvlinks: list[tuple[int, str, int, int]] = field(default_factory=list)
    memory: int = 150754820096
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)


class FakeNVML(types.ModuleType):
    """Just enough of pynvml, answering as the 2x H200 machine did (see the _ansi.source.txt)."""

    NVMLError = FakeNVMLError
    NVML_NVLINK_MAX_LINKS = 36
    NVML_FEATURE_ENABLED = 1
    NVML_P2P_CAPS_INDEX_READ = (0,)  # sic: real pynvml defines it with a trailing comma
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    def __init__(
        self,
        gpus: list[FakeGPU],
        ancestor: int = 30,
        nvlink_p2p: int = 0,
        init_error: int | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.ancestor = ancestor
        self.nvlink_p2p = nvlink_p2p
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGPU:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGPU) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGPU) -> bytes:
        return h.name.encode()  # old pynvml returned bytes

    def nvmlDeviceGetMemoryInfo(self, h: FakeGPU) -> Any:
        return types.SimpleNamespace(total=h.memory)

    def nvmlDeviceGetPciInfo(self, h: FakeGPU) -> Any:
        return types.SimpleNamespace(busId=h.bus)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeGPU) -> int:
        return h.pcie[0]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeGPU) -> int:
        return h.pcie[1]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeGPU) -> int:
        return h.pcie[2]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeGPU) -> int:
        raise FakeNVMLError(3)  # some vGPUs refuse; the probe must carry on

    def _nvlink(self, h: FakeGPU, link: int) -> tuple[int, str, int, int]:
        if not h.nvlinks:
            raise FakeNVMLError(3)
        if link >= len(h.nvlinks):
            raise FakeNVMLError(2)
        return h.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, h: FakeGPU, link: int) -> int:
        return self._nvlink(h, link)[0]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeGPU, link: int) -> Any:
        return types.SimpleNamespace(busId=self._nvlink(h, link)[1])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: FakeGPU, link: int) -> int:
        return self._nvlink(h, link)[2]

    def nvmlDeviceGetNvLinkVersion(self, h: FakeGPU, link: int) -> int:
        return self._nvlink(h, link)[3]

    def nvmlDeviceGetTopologyCommonAncestor(self, a: FakeGPU, b: FakeGPU) -> int:
        return self.ancestor

    def nvmlDeviceGetP2PStatus(self, a: FakeGPU, b: FakeGPU, index: int) -> int:
        if not isinstance(index, int):
            raise TypeError("ctypes.ArgumentError: wrong type")  # what ctypes does with a tuple
        return self.nvlink_p2p if index == 2 else 0


SWITCH = "FFFFFFFF:FF:FF.0"


def h200_box(n: int = 2) -> list[FakeGPU]:
    uuids = ["GPU-037a76d1-e9ad-3414-16e6-c9727c5e2025", "GPU-5acf2a49-e13b-393b-e264-fcbce5baefab"]
    uuids += [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(2, n)]
    return [
        FakeGPU("NVIDIA H200", uuids[i], f"00000000:00:{6 + i:02X}.0", [(1, SWITCH, 2, 6)] * 18)
        for i in range(n)
    ]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(fake: FakeNVML) -> FakeNVML:
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def test_probe_nvml_h200_nvlink_beats_common_ancestor(fake_nvml: Any) -> None:
    fake = fake_nvml(FakeNVML(h200_box(), ancestor=30))
    t = probe_nvml([0, 1])
    link = t.link(0, 1)
    assert (link.link_class, link.nvlinks, link.nvlink_version, link.p2p_supported) == (
        "NV18",
        18,
        4,
        True,
    )
    assert t.source == "nvml" and t.accelerator == "cuda"
    assert t.device_model == "NVIDIA H200"
    d0 = t.devices[0]
    assert (d0.memory_bytes, d0.pcie_gen_max, d0.pcie_gen_current, d0.pcie_width_max) == (
        150754820096,
        5,
        5,
        16,
    )
    assert d0.pcie_width_current is None
    assert [d.bus_id for d in t.devices] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert any("NVSwitch" in n for n in t.notes)
    assert t.key() == h200_pair().key()
    assert fake.shutdowns == 1


def test_probe_nvml_without_nvlink_uses_pcie_ancestor(fake_nvml: Any) -> None:
    gpus = [replace(g, nvlinks=[]) for g in h200_box(4)]
    fake_nvml(FakeNVML(gpus, ancestor=40))
    t = probe_nvml(None)
    assert t.device_count == 4
    assert classes(t) == Counter({"NODE": 6})


@pytest.mark.parametrize(("level", "cls"), [(0, "PIX"), (10, "PIX"), (20, "PXB"), (50, "SYS")])
def test_probe_nvml_ancestor_levels(fake_nvml: Any, level: int, cls: str) -> None:
    fake_nvml(FakeNVML([replace(g, nvlinks=[]) for g in h200_box()], ancestor=level))
    assert probe_nvml().link(0, 1).link_class == cls


def test_probe_nvml_direct_links_count_only_the_peer(fake_nvml: Any) -> None:
    # Three GPUs: 0-1 joined by 2 direct links, 0-2 by 1, 1-2 by none (one link of GPU1 is down).
    bus = ["00000000:1A:00.0", "00000000:1B:00.0", "00000000:1C:00.0"]
    gpus = [FakeGPU("Tesla V100", f"GPU-{i}", bus[i]) for i in range(3)]
    gpus[0].nvlinks = [(1, bus[1], 0, 2), (1, bus[1], 0, 2), (1, bus[2], 0, 2)]
    gpus[1].nvlinks = [(1, bus[0], 0, 2), (1, bus[0], 0, 2), (0, bus[2], 0, 2)]
    gpus[2].nvlinks = [(1, bus[0], 0, 2)]
    fake_nvml(FakeNVML(gpus, ancestor=50))
    t = probe_nvml()
    assert t.link(0, 1).link_class == "NV2" and t.link(0, 1).nvlink_version == 2
    assert t.link(0, 2).link_class == "NV1"
    assert t.link(1, 2).link_class == "SYS"
    assert t.slowest_link() == t.link(1, 2)


def test_probe_nvml_switch_partition_without_peer_access(fake_nvml: Any) -> None:
    fake_nvml(FakeNVML(h200_box(), ancestor=30, nvlink_p2p=5))
    t = probe_nvml()
    assert t.link(0, 1).link_class == "PHB"
    assert any("no NVLink peer access" in n for n in t.notes)


def test_probe_nvml_index_not_visible(fake_nvml: Any) -> None:
    fake_nvml(FakeNVML(h200_box()))
    with pytest.raises(ValueError, match=r"uses cuda:2 but only 2 CUDA device\(s\) are visible"):
        probe_nvml([0, 2])


def test_probe_nvml_honours_cuda_visible_devices(
    fake_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = h200_box(4)
    gpus[2].name = "NVIDIA H100 80GB HBM3"
    fake_nvml(FakeNVML(gpus))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    t = probe_nvml([0, 1])
    assert [d.name for d in t.devices] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert [d.bus_id for d in t.devices] == ["00000000:00:08.0", "00000000:00:06.0"]
    assert t.device_model == "mixed"
    assert any("cuda:0=GPU2, cuda:1=GPU0" in n for n in t.notes)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5acf2a49")  # a UUID prefix
    t = probe_nvml()
    assert [d.bus_id for d in t.devices] == ["00000000:00:07.0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES '1'"):
        probe_nvml([0, 1])


def test_resolve_visible_devices() -> None:
    uuids = ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-aaab-3"]
    assert resolve_visible_devices(None, uuids) == ((0, 1, 2), ())
    assert resolve_visible_devices("2, 0", uuids) == ((2, 0), ())
    assert resolve_visible_devices("GPU-bbbb-2,GPU-aaab", uuids) == ((1, 2), ())
    assert resolve_visible_devices("", uuids) == ((), ())
    visible, notes = resolve_visible_devices("1,7,0", uuids)  # CUDA stops at the bad entry
    assert visible == (1,) and "'7'" in notes[0]
    visible, notes = resolve_visible_devices("GPU-aaa", uuids)  # ambiguous prefix
    assert visible == () and notes
    assert resolve_visible_devices("-1", uuids)[0] == ()
    assert resolve_visible_devices("0,0", uuids)[0] == (0,)
    with pytest.raises(ValueError, match="MIG"):
        resolve_visible_devices("MIG-GPU-aaaa-1/1/0", uuids)


# --------------------------------------------------------------------------- probe failures


def test_probe_degrades_without_nvml(fake_nvml: Any) -> None:
    fake_nvml(FakeNVML(h200_box(), init_error=12))
    t = probe("cuda", 2)
    assert t.device_count == 2 and t.source == "none"
    assert t.link(0, 1).link_class == "unknown"
    assert t.slowest_link().link_class == "unknown"
    assert t.notes == (
        "NVML unavailable: FakeNVMLError: NVML Shared Library Not Found; link classes unknown",
    )


def test_probe_degrades_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    t = probe("cuda", 3)
    assert classes(t) == Counter({"unknown": 3})
    assert t.notes[0].startswith("NVML unavailable: ModuleNotFoundError")
    assert "pynvml" in t.notes[0]


def test_probe_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe("xpu", 2).notes == ("no link probe for accelerator 'xpu'",)
    assert probe("cpu", 0).device_count == 0  # bad count: a topology that says so, no exception

    def boom(ranks: int) -> Topology:
        raise RuntimeError("cpuinfo exploded")

    monkeypatch.setattr(topo, "probe_cpu", boom)
    t = probe("cpu", 2)
    assert t.notes == ("topology probe failed: RuntimeError: cpuinfo exploded",)


# --------------------------------------------------------------------------- CPU


def test_probe_cpu_on_this_host() -> None:
    t = probe_cpu(2)
    assert (t.accelerator, t.source, t.device_count) == ("cpu", "cpu", 2)
    assert t.link(0, 1).link_class == "LOOPBACK" and not t.link(0, 1).is_nvlink
    assert t.host_cpus >= 1 and t.sockets >= 1
    assert t.devices[0].name and t.devices[0].memory_bytes > 0
    assert probe("cpu", 2) == t
    with pytest.raises(ValueError, match="at least one rank"):
        probe_cpu(0)


def test_probe_cpu_reads_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    block = "processor\t: {n}\nmodel name\t: AMD EPYC   7534P 32-Core\nphysical id\t: {s}\n"
    cpuinfo.write_text("\n".join(block.format(n=n, s=n % 2) for n in range(4)), encoding="utf-8")
    monkeypatch.setattr(host, "_CPUINFO", cpuinfo)
    t = probe_cpu(4)
    assert t.device_model == "AMD EPYC 7534P 32-Core"
    assert t.sockets == 2
    assert classes(t) == Counter({"LOOPBACK": 6})


def test_probe_cpu_without_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "_CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(host.platform, "processor", lambda: "arm")
    t = probe_cpu(1)
    assert t.device_model == "arm" and t.sockets == 1 and t.links == ()


# --------------------------------------------------------------------------- import hygiene


def test_package_imports_neither_torch_nor_pytest_nor_pynvml() -> None:
    # Every module of the package, in a fresh interpreter: a new module is covered without a list.
    code = (
        "import importlib, pkgutil, sys\n"
        "import pytest_distperf.topology as t\n"
        "for m in pkgutil.iter_modules(t.__path__):\n"
        "    importlib.import_module(f'{t.__name__}.{m.name}')\n"
        "bad = {'torch', 'pytest', 'pynvml'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(topo.__file__).parents[2])
