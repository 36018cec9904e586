"""Topology fixtures shared by the parsing and probing tests."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_distperf.topology import Device, Link, Topology

DATA = Path(__file__).parent / "data" / "topologies"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def classes(t: Topology) -> Counter[str]:
    return Counter(link.link_class for link in t.links)


def h200_pair(**device_changes: Any) -> Topology:
    devices = tuple(
        replace(
            Device(i, "NVIDIA H200", 150754820096, 5, 5, 16, 16, f"00000000:00:0{6 + i}.0"),
            **device_changes,
        )
        for i in range(2)
    )
    return Topology("cuda", devices, (Link(0, 1, "NV18", 18, 4, True),), "nvml", 32, 1)
