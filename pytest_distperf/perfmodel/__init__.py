"""Predicted tokens/sec per strategy, as a sum of the named terms of one step; pure functions.

No torch and no I/O: the plugin, the `distperf predict` command and the unit tests call the
same functions with plain values (a model shape, a strategy's record, a `Calibration` measured
in the ranks or a `Topology` loaded from a file). A strategy's own terms come from its record,
which implements `StrategyModel`; this package imports no strategy (by name: the registry,
`pytest_distperf.strategies`). The terms and the reasoning behind them: docs/perfmodel.md.

What each module holds: the table at the top of docs/perfmodel.md.
"""

from __future__ import annotations

from pytest_distperf.perfmodel.calibration import (
    Calibration,
    CollectiveFigure,
    MessageSizes,
    bus_factor,
)
from pytest_distperf.perfmodel.links import (
    Links,
    job_links,
    link_figures,
    links_from_calibration,
    nominal_links,
    run_links,
)
from pytest_distperf.perfmodel.network import measured_network
from pytest_distperf.perfmodel.predict import message_sizes, predict, predict_all
from pytest_distperf.perfmodel.prediction import (
    DEFAULT_EFFICIENCY,
    Prediction,
    describe_prediction,
    failure_message,
    threshold,
)
from pytest_distperf.perfmodel.shape import ModelShape
from pytest_distperf.perfmodel.step import (
    Collective,
    StepCost,
    StepInput,
    StrategyModel,
)
from pytest_distperf.perfmodel.terms import (
    DEFAULT_OVERHEADS,
    GB,
    MB,
    TERM_DESCRIPTIONS,
    Overheads,
)
from pytest_distperf.perfmodel.train import (
    model_flops_per_step,
    predict_train,
    train_message_sizes,
)

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_OVERHEADS",
    "GB",
    "MB",
    "TERM_DESCRIPTIONS",
    "Calibration",
    "Collective",
    "CollectiveFigure",
    "Links",
    "MessageSizes",
    "ModelShape",
    "Overheads",
    "Prediction",
    "StepCost",
    "StepInput",
    "StrategyModel",
    "bus_factor",
    "describe_prediction",
    "failure_message",
    "job_links",
    "link_figures",
    "links_from_calibration",
    "measured_network",
    "message_sizes",
    "model_flops_per_step",
    "nominal_links",
    "predict",
    "predict_all",
    "predict_train",
    "run_links",
    "threshold",
    "train_message_sizes",
]
