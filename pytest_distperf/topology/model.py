"""The values of a topology: devices, links, link classes (`nvidia-smi topo -m`'s words, plus
LOOPBACK and "unknown") and their order; JSON round trip and the key."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from pytest_distperf.jsonfields import NUMBER, get_field, json_object
from pytest_distperf.platform import PLATFORMS

SCHEMA = 1
LOOPBACK = "LOOPBACK"
UNKNOWN = "unknown"

# Higher is faster; PCIe classes in nvidia-smi's legend order (fewer bridges keep more bandwidth).
# "unknown" ranks lowest so that `slowest_link()` reports it: a guessed link is worse than none.
_RANK = {"PIX": 6, "PXB": 5, "PHB": 4, "NODE": 3, "SYS": 2, LOOPBACK: 1, UNKNOWN: 0}
_NV_BASE_RANK = 100  # every NVLink bundle beats every PCIe path; more links beat fewer
_NV_RE = re.compile(r"NV(\d+)")
# JSON kinds of the Device, Link and Network fields that are not counts.
_KINDS = {"name": str, "bus_id": str, "link_class": str, "p2p_supported": bool}
_KINDS |= {"busbw": NUMBER, "latency_s": NUMBER, "measured_by": str}


class TopologyError(ValueError):
    """Base of the topology errors: parse and file problems."""


class TopologyParseError(TopologyError):
    """Text that is not `nvidia-smi topo -m` output; the message says what was wrong."""


class TopologyFileError(TopologyError):
    """A topology file that cannot be used; the message names the file and the problem."""


def link_rank(link_class: str) -> int:
    """Order link classes by speed (higher is faster); raises ValueError for a foreign class."""
    m = _NV_RE.fullmatch(link_class)
    if m:
        return _NV_BASE_RANK + int(m.group(1))
    if link_class in _RANK:
        return _RANK[link_class]
    raise ValueError(
        f"unknown link class {link_class!r} (expected NV<n>, PIX, PXB, PHB, NODE, SYS, "
        f"{LOOPBACK} or {UNKNOWN})"
    )


@dataclass(frozen=True)
class Device:
    """One device of the run under the CUDA index it uses (a parsed file's: nvidia-smi's GPU
    number). Unknown: None, `memory_bytes` 0, `name` "unknown"."""

    index: int
    name: str
    memory_bytes: int
    pcie_gen_max: int | None = None
    pcie_gen_current: int | None = None
    pcie_width_max: int | None = None
    pcie_width_current: int | None = None
    bus_id: str | None = None


@dataclass(frozen=True)
class Link:
    """The undirected link between devices `a` and `b` (stored with a < b)."""

    a: int
    b: int
    link_class: str
    nvlinks: int = 0
    nvlink_version: int | None = None
    p2p_supported: bool | None = None

    def __post_init__(self) -> None:
        if self.a == self.b:
            raise ValueError(f"a link joins two devices, got {self.a} twice")
        link_rank(self.link_class)  # validates the class
        # Undirected: storing a < b makes equal links compare equal whoever was asked first.
        a, b = sorted((self.a, self.b))
        object.__setattr__(self, "a", a)
        object.__setattr__(self, "b", b)
        m = _NV_RE.fullmatch(self.link_class)
        if m:
            count = int(m.group(1))
            if self.nvlinks == 0:
                object.__setattr__(self, "nvlinks", count)
            elif self.nvlinks != count:
                raise ValueError(f"{self.link_class} link says it has {self.nvlinks} NVLinks")
        elif self.nvlinks:
            raise ValueError(f"a {self.link_class} link cannot have {self.nvlinks} NVLinks")

    @property
    def is_nvlink(self) -> bool:
        return _NV_RE.fullmatch(self.link_class) is not None

    @property
    def rank(self) -> int:
        return link_rank(self.link_class)


@dataclass(frozen=True)
class Network:
    """The network between a job's nodes as the calibration measured it (None: not yet)."""

    busbw: float | None = None  # bytes/s: bus bandwidth of the largest calibrated all-gather
    latency_s: float | None = None  # a small all-gather across the nodes
    measured_by: str = ""  # e.g. "gloo all-gather over 2 ranks"

    def __post_init__(self) -> None:
        for name in ("busbw", "latency_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")

    def describe(self, nodes: int) -> str:
        where = f"network between {nodes} nodes"
        if self.busbw is None:
            return f"{where}: unknown (the first run's calibration measures it)"
        latency = "" if self.latency_s is None else f", {self.latency_s * 1e6:.3g} us latency"
        how = f" ({self.measured_by})" if self.measured_by else ""
        return f"{where}: measured {self.busbw / 1e9:.3g} GB/s bus bandwidth{latency}{how}"


@dataclass(frozen=True)
class Topology:
    """Devices of one run and the link between every pair (`source`: where from); `host_cpus`,
    `sockets` 0 when unknown. Over several `nodes`, devices and links are one node's."""

    accelerator: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    source: str
    host_cpus: int = 0
    sockets: int = 0
    notes: tuple[str, ...] = field(default=())
    nodes: int = 1
    network: Network = field(default_factory=Network)

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be an integer >= 1, got {self.nodes!r}")
        if not re.fullmatch(r"[a-z][a-z0-9]*", self.accelerator):
            raise ValueError(
                f"accelerator must be a lowercase name like 'cuda', got {self.accelerator!r}"
            )
        devices = tuple(sorted(self.devices, key=lambda d: d.index))
        indices = [d.index for d in devices]
        if len(set(indices)) != len(indices):
            raise ValueError(f"device indices repeat: {indices}")
        links = tuple(sorted(self.links, key=lambda link: (link.a, link.b)))
        pairs = [(link.a, link.b) for link in links]
        expected = [(a, b) for i, a in enumerate(indices) for b in indices[i + 1 :]]
        if pairs != expected:
            missing = sorted(set(expected) - set(pairs))
            extra = sorted(p for p, n in Counter(pairs).items() if n > 1 or p not in expected)
            raise ValueError(
                "links must join every pair of devices exactly once"
                + (f"; missing {missing}" if missing else "")
                + (f"; repeated or foreign {extra}" if extra else "")
            )
        # Sorted storage makes two probes of one machine compare equal whatever order they used.
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "links", links)
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def device_count(self) -> int:
        return len(self.devices)

    @property
    def device_model(self) -> str:
        names = {d.name for d in self.devices}
        if not names:
            return "none"
        return names.pop() if len(names) == 1 else "mixed"

    def link(self, a: int, b: int) -> Link:
        if a == b:
            raise ValueError(f"device {a} has no link to itself")
        for link in self.links:
            if (link.a, link.b) == (min(a, b), max(a, b)):
                return link
        raise KeyError(f"no link between devices {a} and {b} (devices: {self.indices})")

    def first(self, n: int) -> Topology:
        """The topology of the first `n` devices alone, as a run of `n` ranks uses them."""
        keep = set(self.indices[:n])
        links = tuple(link for link in self.links if link.a in keep and link.b in keep)
        return replace(self, devices=tuple(d for d in self.devices if d.index in keep), links=links)

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(d.index for d in self.devices)

    def slowest_link(self) -> Link:
        """The link that bounds a collective over all devices (ring/tree traffic crosses it)."""
        if not self.links:
            raise ValueError(f"a topology of {self.device_count} device(s) has no links")
        return min(self.links, key=lambda link: (link.rank, link.a, link.b))

    def key(self) -> str:
        """A filesystem-safe fingerprint of what performance depends on; never host names, bus ids
        or the current PCIe generation (it drops at idle)."""
        counts = Counter(link.link_class for link in self.links)
        classes = sorted(counts, key=lambda c: (-link_rank(c), c))
        parts = [self.accelerator, _slug(self.device_model), f"x{self.device_count}"]
        parts += [f"{_slug(c)}x{counts[c]}" for c in classes]
        if self.accelerator in PLATFORMS and PLATFORMS[self.accelerator].shares_cores:
            parts.append(f"{self.host_cpus}cpus")
        if self.nodes > 1:
            parts.append(f"{self.nodes}nodes")
        return "_".join(parts)

    def to_dict(self) -> dict[str, Any]:
        # A single node's file as it always was; several nodes: their count and the network.
        nodes = {"nodes": self.nodes, "network": asdict(self.network)} if self.nodes > 1 else {}
        return {
            "schema": SCHEMA,
            "key": self.key(),  # informational for readers of the file; recomputed on load
            "accelerator": self.accelerator,
            "source": self.source,
            "host_cpus": self.host_cpus,
            "sockets": self.sockets,
            "devices": [asdict(d) for d in self.devices],
            "links": [asdict(link) for link in self.links],
            "notes": list(self.notes),
            **nodes,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Topology:
        """Inverse of `to_dict`; raises ValueError saying which field is wrong."""
        data = json_object(data, "topology")
        if "schema" not in data:
            raise ValueError("no 'schema' field (not a topology written by pytest-distperf?)")
        if data["schema"] != SCHEMA:
            raise ValueError(
                f"schema {data['schema']!r} is not supported (this version reads {SCHEMA})"
            )
        notes = get_field(data, "notes", list, "topology", default=[])
        if not all(isinstance(n, str) for n in notes):
            raise ValueError("'notes' must be a list of strings")
        network = get_field(data, "network", Mapping, "topology", default={})
        return cls(
            accelerator=get_field(data, "accelerator", str, "topology"),
            devices=_records(Device, data, "devices"),
            links=_records(Link, data, "links"),
            source=get_field(data, "source", str, "topology"),
            host_cpus=get_field(data, "host_cpus", int, "topology", default=0),
            sockets=get_field(data, "sockets", int, "topology", default=0),
            notes=tuple(notes),
            nodes=get_field(data, "nodes", int, "topology", default=1),
            network=_record(Network, network, "network"),
        )

    def matrix(self, cell: Callable[[int, int], str] | None = None, diagonal: str = " X") -> str:
        """An nvidia-smi-like matrix of `cell(a, b)` (the link classes: `parse_nvidia_smi_topo`
        reads it back for CUDA topologies)."""
        known = PLATFORMS.get(self.accelerator)
        prefix = known.label if known else self.accelerator.upper()
        labels = [f"{prefix}{i}" for i in self.indices]
        cell = cell or (lambda a, b: self.link(a, b).link_class)
        cells = [[diagonal if a == b else cell(a, b) for b in self.indices] for a in self.indices]
        width = max([len(s) for s in labels] + [len(c) for row in cells for c in row] + [4]) + 2
        lines = [" " * width + "".join(label.ljust(width) for label in labels).rstrip()]
        for label, row in zip(labels, cells, strict=True):
            lines.append((label.ljust(width) + "".join(c.ljust(width) for c in row)).rstrip())
        return "\n".join(lines) + "\n"


def _records(cls: type[Any], data: Mapping[str, Any], name: str) -> tuple[Any, ...]:
    items = get_field(data, name, list, "topology")
    return tuple(_record(cls, raw, f"{name}[{i}]") for i, raw in enumerate(items))


def _record(cls: type[Any], raw: Any, where: str) -> Any:
    """A Device, Link or Network from JSON: required without a default, optional if None."""
    data = json_object(raw, where)
    values = {}
    for f in fields(cls):
        kind = _KINDS.get(f.name, int)
        if f.default is MISSING or f.default is None:
            values[f.name] = get_field(data, f.name, kind, where, optional=f.default is None)
        else:
            values[f.name] = get_field(data, f.name, kind, where, default=f.default)
    try:
        return cls(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _slug(text: str) -> str:
    # Lowercase too: keys become file names, and macOS/Windows file systems ignore case.
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "unknown"
