"""Rank half of `tp`: Fabric's `ModelParallelStrategy` (data_parallel_size=1) launches the ranks
and makes the mesh; the split is by hand (`distperf_model.parallelize.tensor_parallel`), by the
model's own plan of module names (a transformers model's `base_model_tp_plan`, `split_by_plan`)
or the marker's `tp_plan`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from distperf_model.parallelize import (
    _split_linear,
    _sum_input_gradient,
    delay_row_parallel_outputs,
    describe_tensor_parallel,
    row_parallel_points,
    tensor_parallel,
    tp_mesh,
)
from torch import nn

from pytest_distperf.ranks.fabric import fabric_module
from pytest_distperf.ranks.models import load_object
from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy


def _build(context: BuildContext) -> Any:
    return fabric_module("strategies").ModelParallelStrategy(
        parallelize_fn=partial(_parallelize, context),
        data_parallel_size=1,
        tensor_parallel_size=context.devices,
    )


def _parallelize(context: BuildContext, model: Any, device_mesh: Any) -> Any:
    plan, training, comm_delay_s = context.tp_plan, context.training, context.comm_delay_s
    if plan is None and callable(getattr(model, "tp_plan", None)):
        model = split_by_plan(model, model.tp_plan(), model.tp_heads(), device_mesh, training)
        model.tp_ways = tp_mesh(device_mesh).size()  # its cache holds this rank's heads only
    elif plan is None:
        model = tensor_parallel(model, device_mesh, training=training)
    else:
        model = load_plan(plan)(model, tp_mesh(device_mesh))
    if comm_delay_s and not delay_row_parallel_outputs(model, comm_delay_s):
        raise ValueError("comm_delay: the tensor-parallel plan left no row-wise linear")
    return model


# Styles of a transformers plan that leave the module whole on every rank (as this project's
# split keeps the embedding whole): the tokens stay the same, only less is split.
KEPT_WHOLE = ("embedding_rowwise", "embedding_colwise", "replicated_with_grad_allreduce")
SPLITS = ("colwise", "rowwise")


def split_by_plan(
    model: nn.Module,
    plan: Mapping[str, str],
    heads: Mapping[str, int],
    device_mesh: Any,
    training: bool = False,
) -> nn.Module:
    """Split `model`'s linears as `plan` names them ("layers.*.mlp.up_proj": "colwise"), by hand
    as `tensor_parallel` splits the reference GPT; the model's attention must infer its local
    head count from the slices (transformers' do), and `heads` must divide by the ranks."""
    mesh = tp_mesh(device_mesh)
    n = mesh.size()
    rank = mesh.get_local_rank() if n > 1 else 0
    group = mesh.get_group() if n > 1 else None
    for what, count in heads.items():
        if count % n:
            raise ValueError(f"tp: {what}={count} is not divisible by {n} ranks")
    patterns = _patterns(plan)
    split = 0
    for name, module in model.named_modules():
        style = next((style for pattern, style in patterns if pattern.fullmatch(name)), None)
        if style is None or style in KEPT_WHOLE:
            continue
        if style not in SPLITS or not isinstance(module, nn.Linear):
            raise ValueError(
                f"tp: the model's plan splits {name} ({type(module).__name__}) as {style!r}; "
                f"the built-in split knows {', '.join(SPLITS)} on nn.Linear (and leaves "
                f"{', '.join(KEPT_WHOLE)} whole): name your own with distperf(tp_plan=...)"
            )
        width = module.out_features if style == "colwise" else module.in_features
        if width % n:
            raise ValueError(f"tp: {name} has {width} features, not divisible by {n} ranks")
        _split_linear(module, style, rank, n, group)
        if n > 1 and training and style == "colwise":
            # each rank's slice saw only its share of the input's gradient: sum it (Megatron's f)
            module.register_forward_pre_hook(partial(_sum_input_gradient, group))
        split += 1
    if not split:
        raise ValueError("tp: the model's plan named no linear of it: nothing would be split")
    return model


def _patterns(plan: Mapping[str, str]) -> list[tuple[re.Pattern[str], str]]:
    """Each plan key as a regular expression (`*`: one module name, a layer's index)."""
    return [
        (re.compile(r"[^.]+".join(re.escape(part) for part in key.split("*"))), style)
        for key, style in plan.items()
    ]


def load_plan(plan: str) -> Any:
    """The function `plan` ("package.module:function") names, or an error that names it."""
    found = load_object(plan, f"distperf(tp_plan={plan!r})")
    if not callable(found):
        raise ValueError(f"tp_plan={plan!r} is not a function (model, tp_mesh) -> model")
    return found


def collective_points(model: nn.Module) -> list[nn.Module]:
    """The linears after whose output the split sums over the ranks (the row-wise ones)."""
    if not callable(getattr(model, "tp_plan", None)):
        return row_parallel_points(model)
    rowwise = [pattern for pattern, style in _patterns(model.tp_plan()) if style == "rowwise"]
    return [
        module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and any(p.fullmatch(name) for p in rowwise)
    ]


HALVES = (
    RankStrategy(
        "tp",
        build=_build,
        describe_sharding=lambda fabric, module: describe_tensor_parallel(
            getattr(module, "module", module)
        ),
        collective_points=collective_points,
    ),
)
