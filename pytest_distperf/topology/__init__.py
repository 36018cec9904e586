"""What links join the devices of a run: probe them (NVML, `nvidia-smi`, CPU host) or load them.

The result is a frozen `Topology` whose `key()` names the kind of machine for baseline files, and
whose `slowest_link()` names the link class that bounds a collective across all devices.

Link classes are written as `nvidia-smi topo -m` writes them ("NV18", "PIX", "PXB", "PHB", "NODE",
"SYS"), plus "LOOPBACK" for CPU ranks on one host and "unknown" when nothing could be probed, so a
user can hold the output of that command next to ours and see the same words.

No torch, no pytest here: `pynvml` is imported only inside `probe_nvml`, so importing the plugin
stays cheap on machines without GPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "LOOPBACK",
    "SCHEMA",
    "UNKNOWN",
    "Device",
    "Link",
    "Topology",
    "TopologyError",
    "TopologyFileError",
    "TopologyParseError",
    "link_rank",
    "load_nvidia_smi_topo",
    "load_topology",
    "parse_nvidia_smi_q_pcie",
    "parse_nvidia_smi_topo",
    "probe",
    "probe_cpu",
    "probe_nvidia_smi",
    "probe_nvml",
    "resolve_visible_devices",
]

SCHEMA = 1
LOOPBACK = "LOOPBACK"
UNKNOWN = "unknown"
NVIDIA_SMI_TIMEOUT_S = 10.0

# Higher is faster. The PCIe classes follow nvidia-smi's legend: the fewer bridges and host
# interconnects a transfer crosses, the more bandwidth it keeps. LOOPBACK only ever appears in CPU
# topologies, so its place relative to the GPU classes does not matter. "unknown" ranks lowest so
# that `slowest_link()` reports it: a threshold built on a guessed link would be worse than none.
_PCIE_RANK = {"PIX": 6, "PXB": 5, "PHB": 4, "NODE": 3, "SYS": 2}
_LOOPBACK_RANK = 1
_UNKNOWN_RANK = 0
_NV_BASE_RANK = 100  # every NVLink bundle beats every PCIe path; more links beat fewer
_NV_RE = re.compile(r"NV(\d+)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class TopologyError(ValueError):
    """Base of this module's errors, so callers can catch both parse and file problems at once."""


class TopologyParseError(TopologyError):
    """Text that is not `nvidia-smi topo -m` output; the message says what was wrong."""


class TopologyFileError(TopologyError):
    """A topology file that cannot be used; the message names the file and the problem."""


def link_rank(link_class: str) -> int:
    """Order link classes by speed (higher is faster); raises ValueError for a foreign class."""
    m = _NV_RE.fullmatch(link_class)
    if m:
        return _NV_BASE_RANK + int(m.group(1))
    if link_class in _PCIE_RANK:
        return _PCIE_RANK[link_class]
    if link_class == LOOPBACK:
        return _LOOPBACK_RANK
    if link_class == UNKNOWN:
        return _UNKNOWN_RANK
    raise ValueError(
        f"unknown link class {link_class!r} (expected NV<n>, PIX, PXB, PHB, NODE, SYS, "
        f"{LOOPBACK} or {UNKNOWN})"
    )


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Device:
    """One device of the run.

    `index` is the CUDA index the run uses (cuda:<index>, after CUDA_VISIBLE_DEVICES) for probed
    topologies, and the GPU number nvidia-smi printed for parsed ones. Unknown values are None,
    except `memory_bytes` (0) and `name` ("unknown"). For CPU ranks `memory_bytes` is the host's
    memory, which all ranks share.
    """

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
        if self.a > self.b:
            a, b = self.b, self.a
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
class Topology:
    """Devices of one run and the link between every pair of them.

    `source` says where it came from: "nvml", "nvidia-smi", "cpu", "none" (nothing could be
    probed), "file:<path>" or "nvidia-smi-topo:<path>". `host_cpus` and `sockets` are 0 when
    unknown (a parsed `nvidia-smi topo -m` does not say them).
    """

    accelerator: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    source: str
    host_cpus: int = 0
    sockets: int = 0
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
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
        lo, hi = min(a, b), max(a, b)
        for link in self.links:
            if link.a == lo and link.b == hi:
                return link
        raise KeyError(f"no link between devices {a} and {b} (devices: {self.indices})")

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(d.index for d in self.devices)

    def slowest_link(self) -> Link:
        """The link that bounds a collective over all devices (ring/tree traffic crosses it).

        Raises ValueError for fewer than two devices: there is no link to speak of.
        """
        if not self.links:
            raise ValueError(f"a topology of {self.device_count} device(s) has no links")
        return min(self.links, key=lambda link: (link.rank, link.a, link.b))

    def key(self) -> str:
        """A stable, filesystem-safe fingerprint of what performance depends on.

        Accelerator, device model, device count and the multiset of link classes; never host
        names, bus ids or the current PCIe generation (it drops at idle to save power). For CPU
        ranks the usable CPU count is part of it too: the "device" is a share of the host, and a
        2-core and a 16-core runner with the same CPU model are different machines for a baseline.
        """
        counts = Counter(link.link_class for link in self.links)
        classes = sorted(counts, key=lambda c: (-link_rank(c), c))
        parts = [self.accelerator, _slug(self.device_model), f"x{self.device_count}"]
        parts += [f"{_slug(c)}x{counts[c]}" for c in classes]
        if self.accelerator == "cpu":
            parts.append(f"{self.host_cpus}cpus")
        return "_".join(parts)

    def to_dict(self) -> dict[str, Any]:
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
        }

    @classmethod
    def from_dict(cls, data: Any) -> Topology:
        """Inverse of `to_dict`; raises ValueError saying which field is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        if "schema" not in data:
            raise ValueError("no 'schema' field (not a topology written by pytest-distperf?)")
        if data["schema"] != SCHEMA:
            raise ValueError(
                f"schema {data['schema']!r} is not supported (this version reads {SCHEMA})"
            )
        devices_raw = _get(data, "devices", list, "topology")
        links_raw = _get(data, "links", list, "topology")
        notes_raw = _get(data, "notes", list, "topology", default=[])
        devices = []
        for i, d in enumerate(devices_raw):
            where = f"devices[{i}]"
            if not isinstance(d, Mapping):
                raise ValueError(f"{where} must be an object")
            devices.append(
                Device(
                    index=_get(d, "index", int, where),
                    name=_get(d, "name", str, where),
                    memory_bytes=_get(d, "memory_bytes", int, where),
                    pcie_gen_max=_get(d, "pcie_gen_max", int, where, optional=True),
                    pcie_gen_current=_get(d, "pcie_gen_current", int, where, optional=True),
                    pcie_width_max=_get(d, "pcie_width_max", int, where, optional=True),
                    pcie_width_current=_get(d, "pcie_width_current", int, where, optional=True),
                    bus_id=_get(d, "bus_id", str, where, optional=True),
                )
            )
        links = []
        for i, raw in enumerate(links_raw):
            where = f"links[{i}]"
            if not isinstance(raw, Mapping):
                raise ValueError(f"{where} must be an object")
            try:
                links.append(
                    Link(
                        a=_get(raw, "a", int, where),
                        b=_get(raw, "b", int, where),
                        link_class=_get(raw, "link_class", str, where),
                        nvlinks=_get(raw, "nvlinks", int, where, default=0),
                        nvlink_version=_get(raw, "nvlink_version", int, where, optional=True),
                        p2p_supported=_get(raw, "p2p_supported", bool, where, optional=True),
                    )
                )
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        if not all(isinstance(n, str) for n in notes_raw):
            raise ValueError("'notes' must be a list of strings")
        return cls(
            accelerator=_get(data, "accelerator", str, "topology"),
            devices=tuple(devices),
            links=tuple(links),
            source=_get(data, "source", str, "topology"),
            host_cpus=_get(data, "host_cpus", int, "topology", default=0),
            sockets=_get(data, "sockets", int, "topology", default=0),
            notes=tuple(notes_raw),
        )

    def matrix(self) -> str:
        """An nvidia-smi-like matrix; `parse_nvidia_smi_topo` reads it back for CUDA topologies."""
        prefix = "GPU" if self.accelerator == "cuda" else self.accelerator.upper()
        labels = [f"{prefix}{i}" for i in self.indices]
        cells = [
            [" X" if a == b else self.link(a, b).link_class for b in self.indices]
            for a in self.indices
        ]
        width = max([len(s) for s in labels] + [len(c) for row in cells for c in row] + [4]) + 2
        lines = [" " * width + "".join(label.ljust(width) for label in labels).rstrip()]
        for label, row in zip(labels, cells, strict=True):
            lines.append((label.ljust(width) + "".join(c.ljust(width) for c in row)).rstrip())
        return "\n".join(lines) + "\n"


def _get(
    data: Mapping[str, Any],
    name: str,
    kind: type,
    where: str,
    *,
    optional: bool = False,
    default: Any = ...,
) -> Any:
    if name not in data:
        if default is not ...:
            return default
        if optional:
            return None
        raise ValueError(f"{where}: missing field {name!r}")
    value = data[name]
    if value is None and optional:
        return value
    # bool is an int in Python; a JSON true where a count belongs is a mistake worth reporting.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: field {name!r} must be {kind.__name__}, got {value!r}")
    return value


def _slug(text: str) -> str:
    # Lowercase too: keys become file names, and macOS/Windows file systems ignore case.
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "unknown"


# --------------------------------------------------------------------------- parsing

_DEVICE_LABEL_RE = re.compile(r"(GPU|NIC)\d+|mlx\d+_\d+")
_GPU_LABEL_RE = re.compile(r"GPU(\d+)")
# Drivers before R384 called the cross-socket class SOC; later ones call the same thing SYS.
_OLD_TOKENS = {"SOC": "SYS"}


def parse_nvidia_smi_topo(text: str) -> Topology:
    """Read `nvidia-smi topo -m` output; keeps GPU-to-GPU links and ignores NICs.

    GPU names and memory are not in that output: devices are named "unknown".
    """
    lines = _ANSI_RE.sub("", text).replace("\r", "").split("\n")
    header_at = _find_header(lines)
    if header_at is None:
        hint = " (this looks like rocm-smi output)" if "ROCm" in text else ""
        raise TopologyParseError(
            "no GPU header line found: expected a line of column names 'GPU0 GPU1 ...' as "
            f"printed by `nvidia-smi topo -m`{hint}"
        )
    block: list[list[str]] = []
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or tokens[0].startswith("Legend"):
            break
        block.append(tokens)
    row_labels = {tokens[0] for tokens in block}
    # Columns run from the header's start up to the first non-device column ("CPU Affinity"):
    # those trailing columns are text with spaces and may be empty, so they are never counted.
    columns: list[str] = []
    for token in lines[header_at].split():
        if token not in row_labels and not _DEVICE_LABEL_RE.fullmatch(token):
            break
        columns.append(token)
    position = {label: i for i, label in enumerate(columns)}
    gpu_rows: dict[int, list[str]] = {}
    for tokens in block:
        m = _GPU_LABEL_RE.fullmatch(tokens[0])
        if not m:
            continue  # NIC rows: the run's collectives do not go GPU -> NIC -> GPU on one host
        label = tokens[0]
        if label not in position:
            raise TopologyParseError(f"row {label} has no column of its own in the header")
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) < len(columns):
            raise TopologyParseError(
                f"row {label} has {len(cells)} link cells but the header names {len(columns)} "
                f"columns ({' '.join(columns)})"
            )
        if int(m.group(1)) in gpu_rows:
            raise TopologyParseError(f"row {label} appears twice")
        gpu_rows[int(m.group(1))] = cells
    if not gpu_rows:
        raise TopologyParseError("no GPU rows found under the header")
    if 0 < len(gpu_rows) < sum(1 for c in columns if _GPU_LABEL_RE.fullmatch(c)):
        missing = [c for c in columns if _GPU_LABEL_RE.fullmatch(c) and int(c[3:]) not in gpu_rows]
        raise TopologyParseError(f"GPU columns without rows: {' '.join(missing)}")

    notes: list[str] = []

    def cell(i: int, j: int) -> str:
        token = gpu_rows[i][position[f"GPU{j}"]]
        if i == j:
            if token != "X":
                raise TopologyParseError(
                    f"row GPU{i}: expected X on the diagonal, found {token!r}"
                    + (" (this looks like rocm-smi output)" if "ROCm" in text else "")
                )
            return token
        if token in _OLD_TOKENS:
            new = _OLD_TOKENS[token]
            note = f"old link name {token} read as {new}"
            if note not in notes:
                notes.append(note)
            token = new
        try:
            link_rank(token)
        except ValueError:
            raise TopologyParseError(
                f"row GPU{i} column GPU{j}: unknown link token {token!r}"
            ) from None
        if token in (LOOPBACK, UNKNOWN):
            raise TopologyParseError(f"row GPU{i} column GPU{j}: unknown link token {token!r}")
        return token

    indices = sorted(gpu_rows)
    links = []
    for n, i in enumerate(indices):
        cell(i, i)
        for j in indices[n + 1 :]:
            forward, backward = cell(i, j), cell(j, i)
            chosen = forward
            if forward != backward:
                # nvidia-smi prints a symmetric matrix; if a copy is not, trust the slower word.
                chosen = min(forward, backward, key=link_rank)
                notes.append(f"GPU{i}-GPU{j} printed as {forward} and {backward}; using {chosen}")
            links.append(Link(i, j, chosen))
    devices = tuple(Device(index=i, name=UNKNOWN, memory_bytes=0) for i in indices)
    return Topology("cuda", devices, tuple(links), "nvidia-smi", notes=tuple(notes))


def _find_header(lines: Sequence[str]) -> int | None:
    for n, line in enumerate(lines):
        tokens = line.split()
        # The GPU0 row also starts with GPU0, but its next token is the diagonal X.
        if tokens and _GPU_LABEL_RE.fullmatch(tokens[0]) and (len(tokens) < 2 or tokens[1] != "X"):
            return n
    return None


_Q_GPU_RE = re.compile(r"GPU\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)")
_Q_FIELDS = {
    ("PCIe Generation", "Max"): "pcie_gen_max",
    ("PCIe Generation", "Current"): "pcie_gen_current",
    ("Link Width", "Max"): "pcie_width_max",
    ("Link Width", "Current"): "pcie_width_current",
}


def parse_nvidia_smi_q_pcie(text: str) -> list[dict[str, Any]]:
    """PCIe link facts per GPU from `nvidia-smi -q` text; [] when there is no GPU section.

    Each dict has bus_id, name, pcie_gen_max, pcie_gen_current, pcie_width_max and
    pcie_width_current (None where the output says N/A or leaves the field out).
    """
    gpus: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    headings: list[tuple[int, str]] = []  # the open section titles, by indentation
    for raw in _ANSI_RE.sub("", text).splitlines():
        if not raw.strip():
            continue
        indent = len(raw) - len(raw.lstrip())
        body = raw.strip()
        m = _Q_GPU_RE.fullmatch(body)
        if m and indent == 0:
            current = {"bus_id": _normal_bus_id(m.group(1)), "name": None}
            current.update(dict.fromkeys(_Q_FIELDS.values()))
            gpus.append(current)
            headings = []
            continue
        if current is None:
            continue
        while headings and headings[-1][0] >= indent:
            headings.pop()
        kv = re.fullmatch(r"(.*?)\s*:\s*(.*)", body)
        if kv is None:
            headings.append((indent, body))
            continue
        key, value = kv.group(1), kv.group(2).strip()
        if key == "Product Name" and not headings:
            current["name"] = value
        elif headings and (headings[-1][1], key) in _Q_FIELDS:
            current[_Q_FIELDS[headings[-1][1], key]] = _int_or_none(value.rstrip("x"))
    return gpus


def _int_or_none(value: Any) -> int | None:
    try:
        return int(str(value).strip().strip("[]"))
    except ValueError:
        return None


# --------------------------------------------------------------------------- host facts

_CPUINFO = Path("/proc/cpuinfo")
_MEMINFO = Path("/proc/meminfo")


def _parse_cpuinfo(text: str) -> tuple[str | None, int]:
    """(CPU model name or None, socket count) from /proc/cpuinfo text."""
    model: str | None = None
    sockets: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), " ".join(value.split())
        if key == "model name" and model is None and value:
            model = value
        elif key == "physical id":
            sockets.add(value)
    return model, len(sockets) or 1


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _host_cpus() -> int:
    # The affinity mask is what this process may use (containers, taskset); cpu_count is the host.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _host_memory_bytes() -> int:
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", _read_text(_MEMINFO), re.MULTILINE)
    if m:
        return int(m.group(1)) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def _host_facts() -> tuple[str, int, int]:
    """(CPU model, usable CPUs, sockets)."""
    model, sockets = _parse_cpuinfo(_read_text(_CPUINFO))
    if not model:
        model = platform.processor() or platform.machine() or "cpu"
    return model, _host_cpus(), sockets


# --------------------------------------------------------------------------- CUDA devices


def resolve_visible_devices(
    value: str | None, uuids: Sequence[str]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Map CUDA's visible order to NVML indices, as the CUDA runtime reads CUDA_VISIBLE_DEVICES.

    `value` is the variable (None when unset); `uuids` are the NVML devices' UUIDs in NVML order.
    Returns (NVML index of cuda:0, cuda:1, ...) and notes. Like CUDA, an entry that names no
    device (or repeats one) ends the list. Integer entries count in PCI bus order, which is
    NVML's order and CUDA's too unless a mixed box sorts its fastest GPU first
    (CUDA_DEVICE_ORDER=FASTEST_FIRST, the default).
    """
    if value is None:
        return tuple(range(len(uuids))), ()
    chosen: list[int] = []
    notes: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.upper().startswith("MIG-"):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={value!r} names a MIG instance; a MIG slice has no link "
                "topology of its own, so links are not probed"
            )
        index: int | None = None
        if re.fullmatch(r"[+-]?\d+", entry):
            n = int(entry)
            index = n if 0 <= n < len(uuids) else None
        elif entry.upper().startswith("GPU-"):
            # CUDA accepts any unambiguous UUID prefix.
            hits = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
            index = hits[0] if len(hits) == 1 else None
        if index is None or index in chosen:
            if entry:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} names no further device, so it "
                    "and the entries after it are ignored, as CUDA does"
                )
            break
        chosen.append(index)
    return tuple(chosen), tuple(notes)


def _pick(visible: Sequence[int], indices: Sequence[int] | None, env: str | None) -> list[int]:
    """The CUDA indices the run uses, checked against what is visible."""
    wanted = list(range(len(visible))) if indices is None else list(indices)
    shown = "unset" if env is None else repr(env)
    for i in wanted:
        if not 0 <= i < len(visible):
            raise ValueError(
                f"the run uses cuda:{i} but only {len(visible)} CUDA device(s) are visible "
                f"(CUDA_VISIBLE_DEVICES {shown})"
            )
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"device indices repeat: {wanted}")
    return wanted


def _mapping_note(wanted: Sequence[int], visible: Sequence[int], env: str | None) -> list[str]:
    if all(visible[i] == i for i in wanted):
        return []
    pairs = ", ".join(f"cuda:{i}=GPU{visible[i]}" for i in wanted)
    return [f"CUDA_VISIBLE_DEVICES={env!r} maps the run's devices to nvidia-smi's numbers: {pairs}"]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _normal_bus_id(value: Any) -> str | None:
    """NVML's PCI bus id form ("00000000:19:00.0"), or None for its no-device placeholder."""
    m = re.fullmatch(
        r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", _text(value).strip().lower()
    )
    if not m:
        return None
    domain, bus, dev, fn = (int(g or "0", 16) for g in m.groups())
    # An NVLink whose far end is an NVSwitch reports FFFFFFFF:FF:FF.0 (seen on an HGX H200).
    if domain == 0xFFFFFFFF or bus == 0xFF:
        return None
    return f"{domain:08X}:{bus:02X}:{dev:02X}.{fn:X}"


# --------------------------------------------------------------------------- NVML

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi words. INTERNAL (two GPUs on one
# board behind its own bridge, e.g. K80) is what nvidia-smi prints as PIX.
_ANCESTOR_CLASS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetNvLinkVersion returns nvmlNvlinkVersion_t (an H200 answers 6 = NVLink 4.0), not
# the version number itself; we store the major version.
_NVLINK_MAJOR = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
_REMOTE_GPU, _REMOTE_NPU, _REMOTE_SWITCH = 0, 1, 2


@dataclass(frozen=True)
class _LinkEnd:
    """One active NVLink of a GPU: where its far end is."""

    remote_bus: str | None
    to_switch: bool
    version: int | None


def _const(nv: Any, name: str, default: int) -> int:
    value = getattr(nv, name, default)
    # pynvml defines NVML_P2P_CAPS_INDEX_READ as `0,` (a tuple); ctypes rejects a tuple.
    if isinstance(value, tuple):
        value = value[0] if value else default
    return int(value)


def _nvml_try(nv: Any, fn_name: str, *args: Any) -> Any:
    """Call an NVML function; None when the driver says no (not supported, old driver, ...)."""
    fn = getattr(nv, fn_name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _nvlink_ends(nv: Any, handle: Any, gpu_buses: set[str]) -> list[_LinkEnd]:
    ends = []
    enabled = _const(nv, "NVML_FEATURE_ENABLED", 1)
    for link in range(_const(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        # Links past the GPU's own count answer InvalidArgument; GPUs without NVLink NotSupported.
        if _nvml_try(nv, "nvmlDeviceGetNvLinkState", handle, link) != enabled:
            continue
        pci = _nvml_try(nv, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        remote = _normal_bus_id(pci.busId) if pci is not None else None
        kind = _nvml_try(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if kind == _REMOTE_NPU:
            continue  # an NVLink to a POWER CPU: host traffic, not GPU-to-GPU
        if kind in (_REMOTE_GPU, _REMOTE_SWITCH):
            to_switch = kind == _REMOTE_SWITCH
        else:
            # Drivers without the device-type query: a far end that is no GPU of this host is
            # taken for an NVSwitch (DGX-2 era). A POWER9 NPU would be misread; those drivers
            # all have the query.
            to_switch = remote not in gpu_buses
        version = _nvml_try(nv, "nvmlDeviceGetNvLinkVersion", handle, link)
        ends.append(_LinkEnd(remote, to_switch, _NVLINK_MAJOR.get(version)))
    return ends


def _nvml_pair(
    nv: Any,
    a: int,
    b: int,
    handles: tuple[Any, Any],
    buses: tuple[str | None, str | None],
    ends: tuple[list[_LinkEnd], list[_LinkEnd]],
) -> tuple[Link, list[str]]:
    notes: list[str] = []
    ha, hb = handles
    ok = _const(nv, "NVML_P2P_STATUS_OK", 0)
    p2p_status = _nvml_try(
        nv, "nvmlDeviceGetP2PStatus", ha, hb, _const(nv, "NVML_P2P_CAPS_INDEX_READ", 0)
    )
    p2p = None if p2p_status is None else p2p_status == ok
    # NVLink first: NVML's common ancestor only describes the PCIe path (an HGX H200 pair joined
    # by 18 NVLinks answers HOSTBRIDGE there).
    direct_ab = [e for e in ends[0] if not e.to_switch and e.remote_bus == buses[1]]
    direct_ba = [e for e in ends[1] if not e.to_switch and e.remote_bus == buses[0]]
    direct = direct_ab if len(direct_ab) >= len(direct_ba) else direct_ba
    switch_a = [e for e in ends[0] if e.to_switch]
    switch_b = [e for e in ends[1] if e.to_switch]
    # Through NVSwitches every GPU reaches every other at the rate of its own links; the pair
    # gets the smaller GPU's count, which is what nvidia-smi prints (NV12 on a DGX A100, NV18 on
    # HGX H100/H200). One host's switches form one fabric, but Fabric Manager can partition it
    # (cloud VMs): ask NVML whether the pair can really talk over NVLink before counting it.
    switched = switch_a if len(switch_a) <= len(switch_b) else switch_b
    if switched and not direct:
        status = _nvml_try(
            nv, "nvmlDeviceGetP2PStatus", ha, hb, _const(nv, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
        )
        if status is not None and status != ok:
            notes.append(
                f"GPU{a}-GPU{b}: both have active NVLinks to NVSwitches but NVML reports no "
                f"NVLink peer access (status {status}, another NVLink partition or Fabric Manager "
                "down?); using the PCIe path"
            )
            switched = []
    counted = direct + switched
    if counted:
        versions = {e.version for e in counted if e.version is not None}
        version = min(versions) if versions else None
        n = len(counted)
        return Link(a, b, f"NV{n}", n, version, p2p), notes
    level = _nvml_try(nv, "nvmlDeviceGetTopologyCommonAncestor", ha, hb)
    link_class = _ANCESTOR_CLASS.get(level, UNKNOWN) if level is not None else UNKNOWN
    if link_class == UNKNOWN:
        notes.append(f"GPU{a}-GPU{b}: NVML gave no PCIe common ancestor (answer {level!r})")
    return Link(a, b, link_class, p2p_supported=p2p), notes


def probe_nvml(indices: Sequence[int] | None = None) -> Topology:
    """Probe the run's GPUs through NVML (nvidia-ml-py).

    `indices` are CUDA indices (after CUDA_VISIBLE_DEVICES) of the devices the run uses; None
    means all visible ones. Raises ImportError when pynvml is missing, pynvml.NVMLError when the
    driver does not answer, ValueError when the indices are not visible.
    """
    import pynvml as nv

    nv.nvmlInit()
    try:
        count = int(nv.nvmlDeviceGetCount())
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible, env_notes = resolve_visible_devices(env, uuids)
        wanted = _pick(visible, indices, env)
        buses = []
        for h in handles:
            pci = _nvml_try(nv, "nvmlDeviceGetPciInfo", h)
            buses.append(_normal_bus_id(pci.busId) if pci is not None else None)
        gpu_buses = {bus for bus in buses if bus is not None}
        devices = []
        for cuda_index in wanted:
            h = handles[visible[cuda_index]]
            memory = _nvml_try(nv, "nvmlDeviceGetMemoryInfo", h)
            devices.append(
                Device(
                    index=cuda_index,
                    name=_text(nv.nvmlDeviceGetName(h)),
                    memory_bytes=int(memory.total) if memory is not None else 0,
                    pcie_gen_max=_nvml_try(nv, "nvmlDeviceGetMaxPcieLinkGeneration", h),
                    pcie_gen_current=_nvml_try(nv, "nvmlDeviceGetCurrPcieLinkGeneration", h),
                    pcie_width_max=_nvml_try(nv, "nvmlDeviceGetMaxPcieLinkWidth", h),
                    pcie_width_current=_nvml_try(nv, "nvmlDeviceGetCurrPcieLinkWidth", h),
                    bus_id=buses[visible[cuda_index]],
                )
            )
        ends = {i: _nvlink_ends(nv, handles[visible[i]], gpu_buses) for i in wanted}
        links = []
        notes = list(env_notes) + _mapping_note(wanted, visible, env)
        for n, a in enumerate(wanted):
            for b in wanted[n + 1 :]:
                na, nb = visible[a], visible[b]
                link, pair_notes = _nvml_pair(
                    nv, a, b, (handles[na], handles[nb]), (buses[na], buses[nb]), (ends[a], ends[b])
                )
                links.append(link)
                notes += pair_notes
        if any(e.to_switch for es in ends.values() for e in es) and any(
            link.is_nvlink for link in links
        ):
            notes.append("NVLink through NVSwitch: each pair counts the smaller GPU's link count")
    finally:
        # A failed shutdown must not hide the probe's result (or its exception).
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    _, cpus, sockets = _host_facts()
    return Topology("cuda", tuple(devices), tuple(links), "nvml", cpus, sockets, tuple(notes))


# --------------------------------------------------------------------------- nvidia-smi

_QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "pci.bus_id",
    "pcie.link.gen.max",
    "pcie.link.gen.current",
    "pcie.link.width.max",
    "pcie.link.width.current",
)


def _run_nvidia_smi(exe: str, *args: str) -> str:
    try:
        done = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"`nvidia-smi {' '.join(args)}` did not answer in {NVIDIA_SMI_TIMEOUT_S:g} s"
        ) from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout or "").strip().splitlines()
        raise RuntimeError(
            f"`nvidia-smi {' '.join(args)}` exited with {done.returncode}"
            + (f": {detail[0]}" if detail else "")
        )
    return done.stdout


def _parse_query(text: str) -> dict[int, dict[str, str]]:
    rows: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(_QUERY_FIELDS) or not values[0].isdigit():
            continue
        rows[int(values[0])] = dict(zip(_QUERY_FIELDS, values, strict=True))
    return rows


def probe_nvidia_smi(indices: Sequence[int] | None = None) -> Topology:
    """Probe through the `nvidia-smi` command, for hosts where NVML's Python binding fails.

    Links come from `nvidia-smi topo -m`; names, memory and PCIe facts from `--query-gpu` when
    that works. Raises FileNotFoundError when nvidia-smi is not on PATH, RuntimeError when it
    fails, TopologyParseError when its output cannot be read.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not found on PATH")
    parsed = parse_nvidia_smi_topo(_run_nvidia_smi(exe, "topo", "-m"))
    notes = list(parsed.notes)
    try:
        query = _parse_query(
            _run_nvidia_smi(
                exe, f"--query-gpu={','.join(_QUERY_FIELDS)}", "--format=csv,noheader,nounits"
            )
        )
    except RuntimeError as exc:
        query = {}
        notes.append(f"GPU names unknown: {exc}")
    count = max(parsed.indices) + 1
    # Without the query no UUIDs are known, so UUID entries in CUDA_VISIBLE_DEVICES match nothing.
    uuids = [query.get(i, {}).get("uuid", "") for i in range(count)]
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible, env_notes = resolve_visible_devices(env, uuids)
    visible = tuple(v for v in visible if v in parsed.indices)
    wanted = _pick(visible, indices, env)
    devices = []
    for cuda_index in wanted:
        row = query.get(visible[cuda_index])
        if row is None:
            devices.append(Device(index=cuda_index, name=UNKNOWN, memory_bytes=0))
            continue
        mib = _int_or_none(row["memory.total"])
        devices.append(
            Device(
                index=cuda_index,
                name=row["name"],
                memory_bytes=mib * 1024 * 1024 if mib is not None else 0,
                pcie_gen_max=_int_or_none(row["pcie.link.gen.max"]),
                pcie_gen_current=_int_or_none(row["pcie.link.gen.current"]),
                pcie_width_max=_int_or_none(row["pcie.link.width.max"]),
                pcie_width_current=_int_or_none(row["pcie.link.width.current"]),
                bus_id=_normal_bus_id(row["pci.bus_id"]),
            )
        )
    links = [
        replace(parsed.link(visible[a], visible[b]), a=a, b=b)
        for n, a in enumerate(wanted)
        for b in wanted[n + 1 :]
    ]
    notes = list(env_notes) + _mapping_note(wanted, visible, env) + notes
    _, cpus, sockets = _host_facts()
    return Topology("cuda", tuple(devices), tuple(links), "nvidia-smi", cpus, sockets, tuple(notes))


# --------------------------------------------------------------------------- CPU and entry point


def probe_cpu(ranks: int) -> Topology:
    """`ranks` CPU processes on this host, joined by loopback (gloo over 127.0.0.1)."""
    if ranks < 1:
        raise ValueError(f"a CPU run needs at least one rank, got {ranks}")
    model, cpus, sockets = _host_facts()
    memory = _host_memory_bytes()
    devices = tuple(Device(index=i, name=model, memory_bytes=memory) for i in range(ranks))
    links = tuple(Link(a, b, LOOPBACK) for a in range(ranks) for b in range(a + 1, ranks))
    notes = ()
    if ranks > cpus:
        notes = (f"{ranks} ranks share {cpus} usable CPUs: ranks will time-slice",)
    return Topology("cpu", devices, links, "cpu", cpus, sockets, notes)


def _degraded(accelerator: str, device_count: int, notes: Iterable[str]) -> Topology:
    n = max(device_count, 0)
    _, cpus, sockets = _host_facts()
    devices = tuple(Device(index=i, name=UNKNOWN, memory_bytes=0) for i in range(n))
    links = tuple(Link(a, b, UNKNOWN) for a in range(n) for b in range(a + 1, n))
    return Topology(accelerator, devices, links, "none", cpus, sockets, tuple(notes))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def probe(accelerator: str, device_count: int) -> Topology:
    """The topology of a run of `device_count` devices; never raises.

    CUDA: NVML, else `nvidia-smi`, else a topology of "unknown" links whose notes say what
    failed (a verdict can then decline to judge instead of guessing). CPU: `probe_cpu`.
    """
    accel = accelerator.strip().lower() if isinstance(accelerator, str) else ""
    if not re.fullmatch(r"[a-z][a-z0-9]*", accel):
        accel = UNKNOWN
    try:
        if accel == "cpu":
            return probe_cpu(device_count)
        if accel != "cuda":
            return _degraded(
                accel, device_count, [f"no link probe for accelerator {accelerator!r}"]
            )
        indices = list(range(device_count))
        failures = []
        try:
            return probe_nvml(indices)
        except Exception as exc:  # noqa: BLE001 - any NVML failure means: try the next probe
            failures.append(f"NVML unavailable: {_describe(exc)}")
        try:
            found = probe_nvidia_smi(indices)
            return replace(found, notes=tuple(failures) + found.notes)
        except FileNotFoundError:
            failures.append("nvidia-smi not found")
        except Exception as exc:  # noqa: BLE001
            failures.append(f"nvidia-smi failed: {_describe(exc)}")
        return _degraded(accel, device_count, ["; ".join(failures) + "; link classes unknown"])
    except Exception as exc:  # noqa: BLE001 - the last resort behind "never raises"
        return _degraded(accel, device_count, [f"topology probe failed: {_describe(exc)}"])


# --------------------------------------------------------------------------- files


def _read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyFileError(f"topology file {path} does not exist") from None
    except IsADirectoryError:
        raise TopologyFileError(f"topology file {path} is a directory") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyFileError(f"topology file {path} could not be read: {exc}") from None


def _fit(topology: Topology, expected_devices: int | None, path: Path) -> Topology:
    """Hold a saved topology to the run's device count.

    More devices than the run is fine: a run of N ranks uses cuda:0..N-1, the first N devices of
    the saved machine, just as a live probe would see them. Fewer cannot describe the run.
    """
    n = topology.device_count
    if expected_devices is None or n == expected_devices:
        return topology
    if n < expected_devices:
        raise TopologyFileError(
            f"topology file {path} describes {n} devices but the run uses {expected_devices}"
        )
    keep = topology.indices[:expected_devices]
    return replace(
        topology,
        devices=tuple(d for d in topology.devices if d.index in keep),
        links=tuple(link for link in topology.links if link.a in keep and link.b in keep),
        notes=topology.notes
        + (
            f"topology file {path} describes {n} devices; the run uses {expected_devices}, "
            f"so only the first {expected_devices} ({', '.join(map(str, keep))}) are kept",
        ),
    )


def load_topology(path: str | os.PathLike[str], expected_devices: int | None = None) -> Topology:
    """Read a topology saved as JSON by `Topology.to_dict`; raises TopologyFileError."""
    p = Path(path)
    text = _read_file(p)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TopologyFileError(f"topology file {p} is not JSON: {exc}") from None
    try:
        topology = Topology.from_dict(data)
    except ValueError as exc:
        raise TopologyFileError(f"topology file {p} has the wrong shape: {exc}") from None
    topology = replace(
        topology,
        source=f"file:{p}",
        notes=topology.notes + (f"loaded from {p}; first probed via {topology.source}",),
    )
    return _fit(topology, expected_devices, p)


def load_nvidia_smi_topo(
    path: str | os.PathLike[str], expected_devices: int | None = None
) -> Topology:
    """Read a saved `nvidia-smi topo -m` output; raises TopologyFileError."""
    p = Path(path)
    try:
        topology = parse_nvidia_smi_topo(_read_file(p))
    except TopologyParseError as exc:
        raise TopologyFileError(
            f"topology file {p} is not `nvidia-smi topo -m` output: {exc}"
        ) from None
    topology = replace(topology, source=f"nvidia-smi-topo:{p}")
    return _fit(topology, expected_devices, p)
