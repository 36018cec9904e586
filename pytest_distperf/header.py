"""The report header (before collection: it never probes) and the lines after collection (the
probed topology, each rank count's calibration)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pytest_distperf import xdist

CALIBRATION_PENDING = "not yet (calibrated in the first run of each rank count)"


def report_header(plugin: Any, config: pytest.Config) -> list[str]:  # plugin: DistperfPlugin
    settings = plugin.settings
    resolved = plugin.resolve()
    if plugin.job is not None:
        ranks = f"{resolved.devices} ranks (this job's; only its rank 0 writes reports)"
    elif settings.devices is None:
        ranks = f"{resolved.devices} ranks per test (--distperf-devices auto)"
    else:
        ranks = f"{resolved.devices} ranks per test"
    seen = ""
    if settings.accelerator != "cpu":
        auto = "auto: " if settings.accelerator == "auto" else ""
        seen = f" ({auto}{resolved.visible_gpus} GPU(s) visible)"
    if settings.topology:
        topology = f"from {settings.topology}, loaded when the first distperf test runs"
    else:
        topology = "probed when the first distperf test runs"
    lines = [
        f"distperf: accelerator {resolved.accelerator}{seen}, {ranks}, "
        f"{settings.repeats} repeats after {settings.warmup} warm-up",
        f"distperf: topology {topology}; calibration {CALIBRATION_PENDING}",
    ]
    note = xdist.header_line(config)
    if note:
        lines.append(f"distperf: {note}")
    return lines


def topology_line(topology: Any) -> str:
    """Key, link classes (of a node, and the network between several), source and notes."""
    classes = sorted({link.link_class for link in topology.links})
    links = f"links {', '.join(classes)}" if classes else "no links (one device)"
    if topology.nodes > 1:  # a node's own links, then the network between the nodes
        links = f"per node {links}; {topology.network.describe(topology.nodes)}"
    notes = "".join(f"; {note}" for note in topology.notes)
    return f"topology {topology.key()}: {links} (from {topology.source}){notes}"


def collection_lines(topology: Any, sizes: Mapping[int, Any]) -> list[str]:
    """After collection: the probed topology and what each rank count will calibrate."""
    counts = []
    for count in sorted(sizes):
        measured = sizes[count]
        if measured is None:
            counts.append(f"{count} ranks: nothing (no all-gather in the selected tests)")
        else:
            counts.append(
                f"{count} ranks: {len(measured.all_gather)} all-gather and "
                f"{len(measured.all_reduce)} all-reduce sizes"
            )
    calibration = "; ".join(counts) or "nothing to calibrate"
    return [
        f"distperf: {topology_line(topology)}",
        f"distperf: calibration in the first run of each rank count: {calibration}",
    ]
