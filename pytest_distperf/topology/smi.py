"""The (pure) parser of `nvidia-smi topo -m` text, as saved from a machine."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence

from pytest_distperf.topology.model import (
    LOOPBACK,
    UNKNOWN,
    Device,
    Link,
    Topology,
    TopologyParseError,
    link_rank,
)

# Piped or saved copies can carry terminal colour codes; the parser strips them.
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

_DEVICE_LABEL_RE = re.compile(r"(GPU|NIC)\d+|mlx\d+_\d+")
_GPU_LABEL_RE = re.compile(r"GPU(\d+)")
# Drivers before R384 called the cross-socket class SOC; later ones call the same thing SYS.
_OLD_TOKENS = {"SOC": "SYS"}


def parse_nvidia_smi_topo(text: str) -> Topology:
    """Read `nvidia-smi topo -m` output: its GPU-to-GPU links (no NICs); devices "unknown"."""
    lines = _ANSI_RE.sub("", text).replace("\r", "").split("\n")
    rocm = " (this looks like rocm-smi output)" if "ROCm" in text else ""
    header_at = _find_header(lines)
    if header_at is None:
        raise TopologyParseError(
            "no GPU header line found: expected a line of column names 'GPU0 GPU1 ...' as "
            f"printed by `nvidia-smi topo -m`{rocm}"
        )
    block = _matrix_rows(lines[header_at + 1 :])
    columns = _columns(lines[header_at], {tokens[0] for tokens in block})
    rows = _gpu_rows(block, columns)
    position = {label: n for n, label in enumerate(columns)}  # a column's cell in a row
    notes: list[str] = []

    def cell(i: int, j: int) -> str:
        token = rows[i][position[f"GPU{j}"]]
        if token in _OLD_TOKENS:
            note = f"old link name {token} read as {_OLD_TOKENS[token]}"
            if note not in notes:
                notes.append(note)
            token = _OLD_TOKENS[token]
        with contextlib.suppress(ValueError):  # NV<n> and PCIe words; not LOOPBACK nor unknown
            if link_rank(token) > link_rank(LOOPBACK):
                return token
        raise TopologyParseError(f"row GPU{i} column GPU{j}: unknown link token {token!r}")

    indices = sorted(rows)
    links = []
    for n, i in enumerate(indices):
        diagonal = rows[i][position[f"GPU{i}"]]
        if diagonal != "X":
            raise TopologyParseError(
                f"row GPU{i}: expected X on the diagonal, found {diagonal!r}{rocm}"
            )
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


def _matrix_rows(lines: Sequence[str]) -> list[list[str]]:
    """The matrix's rows (tokens), from the line after the header to a blank line or the legend."""
    block: list[list[str]] = []
    for line in lines:
        tokens = line.split()
        if not tokens or tokens[0].startswith("Legend"):
            break
        block.append(tokens)
    return block


def _columns(header: str, row_labels: set[str]) -> list[str]:
    """The header's device columns, up to "CPU Affinity" and the other free-text ones."""
    columns: list[str] = []
    for token in header.split():
        if token not in row_labels and not _DEVICE_LABEL_RE.fullmatch(token):
            break
        columns.append(token)
    return columns


def _gpu_rows(block: Sequence[Sequence[str]], columns: Sequence[str]) -> dict[int, list[str]]:
    """GPU index -> its row's link cells, one per column; NIC rows are left out."""
    gpu_rows: dict[int, list[str]] = {}
    for tokens in block:
        m = _GPU_LABEL_RE.fullmatch(tokens[0])
        if not m:
            continue  # NIC rows: the run's collectives do not go GPU -> NIC -> GPU on one host
        label = tokens[0]
        if label not in columns:
            raise TopologyParseError(f"row {label} has no column of its own in the header")
        cells = list(tokens[1 : 1 + len(columns)])
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
    gpu_columns = [c for c in columns if _GPU_LABEL_RE.fullmatch(c)]
    if len(gpu_rows) < len(gpu_columns):
        missing = [c for c in gpu_columns if int(c[3:]) not in gpu_rows]
        raise TopologyParseError(f"GPU columns without rows: {' '.join(missing)}")
    return gpu_rows


def _find_header(lines: Sequence[str]) -> int | None:
    for n, line in enumerate(lines):
        tokens = line.split()
        # The GPU0 row also starts with GPU0, but its next token is the diagonal X.
        if tokens and _GPU_LABEL_RE.fullmatch(tokens[0]) and (len(tokens) < 2 or tokens[1] != "X"):
            return n
    return None
