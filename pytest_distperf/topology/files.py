"""Topologies from saved files (our JSON or `nvidia-smi topo -m`), to name another machine."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from pytest_distperf.topology.model import Topology, TopologyFileError, TopologyParseError
from pytest_distperf.topology.smi import parse_nvidia_smi_topo


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
    """Hold a saved topology to the run's device count: a run of N ranks uses its first N
    devices, as a live probe would; fewer devices cannot describe the run."""
    n = topology.device_count
    if expected_devices is None or n == expected_devices:
        return topology
    if n < expected_devices:
        raise TopologyFileError(
            f"topology file {path} describes {n} devices but the run uses {expected_devices}"
        )
    kept = topology.first(expected_devices)
    note = (
        f"topology file {path} describes {n} devices; the run uses {expected_devices}, "
        f"so only the first {expected_devices} ({', '.join(map(str, kept.indices))}) are kept"
    )
    return replace(kept, notes=(*kept.notes, note))


def load_topology(path: str | os.PathLike[str], expected_devices: int | None = None) -> Topology:
    """Read a topology saved as JSON by `Topology.to_dict`; raises TopologyFileError."""
    p = Path(path)
    text = _read_file(p)
    try:
        topology = Topology.from_dict(json.loads(text))
    except json.JSONDecodeError as exc:
        raise TopologyFileError(f"topology file {p} is not JSON: {exc}") from None
    except ValueError as exc:
        raise TopologyFileError(f"topology file {p} has the wrong shape: {exc}") from None
    note = f"loaded from {p}; first probed via {topology.source}"
    topology = replace(topology, source=f"file:{p}", notes=(*topology.notes, note))
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
