"""Rank half of `tp`: Fabric's `ModelParallelStrategy` (data_parallel_size=1) launches the ranks
and makes the mesh; the split is by hand (`distperf_model.parallelize.tensor_parallel`) or the
marker's `tp_plan`."""

from __future__ import annotations

import importlib
from functools import partial
from typing import Any

from distperf_model.parallelize import (
    delay_row_parallel_outputs,
    describe_tensor_parallel,
    row_parallel_points,
    tensor_parallel,
    tp_mesh,
)

from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy


def _build(context: BuildContext) -> Any:
    return fabric_module("strategies").ModelParallelStrategy(
        parallelize_fn=partial(
            _parallelize, context.tp_plan, context.comm_delay_s, context.training
        ),
        data_parallel_size=1,
        tensor_parallel_size=context.devices,
    )


def _parallelize(
    plan: str | None, comm_delay_s: float, training: bool, model: Any, device_mesh: Any
) -> Any:
    if plan is None:
        model = tensor_parallel(model, device_mesh, training=training)
    else:
        model = load_plan(plan)(model, tp_mesh(device_mesh))
    if comm_delay_s and not delay_row_parallel_outputs(model, comm_delay_s):
        raise ValueError("comm_delay: the tensor-parallel plan left no row-wise linear")
    return model


def load_plan(plan: str) -> Any:
    """The function `plan` ("package.module:function") names, or an error that names it."""
    module_name, _, function = plan.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"tp_plan={plan!r}: {type(error).__name__}: {error}") from None
    if not callable(found):
        raise ValueError(f"tp_plan={plan!r} is not a function (model, tp_mesh) -> model")
    return found


def _describe_sharding(fabric: Any, module: Any) -> str:
    return describe_tensor_parallel(getattr(module, "module", module))


HALVES = (
    RankStrategy(
        "tp",
        build=_build,
        describe_sharding=_describe_sharding,
        collective_points=row_parallel_points,
    ),
)
