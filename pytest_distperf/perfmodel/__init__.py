"""Predicted tokens/sec per strategy, as a sum of the named terms of one step; pure functions of
plain values (no torch, no I/O, no strategy by name). What each module holds: docs/perfmodel.md."""

from __future__ import annotations

from pytest_distperf.perfmodel.calibration import Calibration, CollectiveFigure, MessageSizes
from pytest_distperf.perfmodel.links import (
    Links,
    link_figures,
    links_from_calibration,
    measured_network,
    run_links,
)
from pytest_distperf.perfmodel.prediction import (
    DEFAULT_EFFICIENCY,
    Prediction,
    failure_message,
    threshold,
)
from pytest_distperf.perfmodel.terms import DEFAULT_OVERHEADS, GB, MB, Overheads
from pytest_distperf.perfmodel.train import model_flops_per_step

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_OVERHEADS",
    "GB",
    "MB",
    "Calibration",
    "CollectiveFigure",
    "Links",
    "MessageSizes",
    "Overheads",
    "Prediction",
    "failure_message",
    "link_figures",
    "links_from_calibration",
    "measured_network",
    "model_flops_per_step",
    "run_links",
    "threshold",
]
