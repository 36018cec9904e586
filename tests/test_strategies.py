"""The strategy records, both halves: each one complete, the pure half a `StrategyModel`, and a
new record predicted without touching perfmodel."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
from distperf_model.config import PRESETS

from pytest_distperf.perfmodel import DEFAULT_OVERHEADS, Links, MessageSizes
from pytest_distperf.perfmodel.calibration import LATENCY_PROBE_BYTES
from pytest_distperf.perfmodel.predict import message_sizes, predict
from pytest_distperf.perfmodel.step import Collective, StepCost, StepInput, StrategyModel
from pytest_distperf.platform import CPU, CUDA
from pytest_distperf.ranks.strategies import (
    RANK_STRATEGIES,
    BuildContext,
    RankStrategy,
    rank_strategy,
)
from pytest_distperf.strategies import (
    STRATEGIES,
    StrategyRecord,
    get_strategy,
    message_sizes_for,
    predict_all_for,
    predict_for,
    strategy_names,
)
from pytest_distperf.strategies.record import data_parallel

PERFMODEL = Path(__file__).resolve().parent.parent / "pytest_distperf" / "perfmodel"
LINKS = Links("NV18", 2, 250e9, 40e-6, 4e12, False)
HOOKS = ("wrap", "next_token")  # optional: None means Fabric's setup_module and sampling


@pytest.mark.parametrize("name", strategy_names())
def test_every_record_is_complete(name: str) -> None:
    record = STRATEGIES[name]
    assert record.name == name and record.description
    assert isinstance(record, StrategyModel)
    for part in ("cost", "replicas", "message_sizes", "check"):
        assert callable(getattr(record, part)), part
    assert isinstance(record.decodes_across_ranks, bool)
    assert record.runs_on and record.runs_on <= {"cpu", "cuda"}
    assert record.min_ranks >= 1
    assert record.replicas(4) >= 1
    sizes = record.message_sizes(PRESETS["tiny"], 2, 1)
    assert isinstance(sizes, MessageSizes)
    # a sharded model's weights are gathered, or its activations travel between its ranks
    assert sizes.all_gather or sizes.all_reduce or sizes.p2p or not record.sharded
    assert record.check(PRESETS["tiny"], 2) is None
    for device_type in sorted(record.runs_on):
        x = StepInput(PRESETS["tiny"], 2, device_type, 1, 58, 2, 2, LINKS, DEFAULT_OVERHEADS)
        assert isinstance(record.cost(x), StepCost)
        if not record.train_refusal:
            assert isinstance(record.cost(replace(x, training=True)), StepCost)


@pytest.mark.parametrize("name", strategy_names())
def test_every_record_has_its_rank_half(name: str) -> None:
    half = rank_strategy(name)
    assert isinstance(half, RankStrategy) and half.name == name
    assert callable(half.build) and callable(half.describe_sharding)
    assert all(getattr(half, hook) is None or callable(getattr(half, hook)) for hook in HOOKS)
    # a strategy that steps the decode itself is one whose rank half has the step
    assert (half.next_token is not None) == STRATEGIES[name].decodes_across_ranks


def test_both_registries_name_the_same_strategies_in_order() -> None:
    assert tuple(RANK_STRATEGIES) == strategy_names()
    with pytest.raises(ValueError, match="unknown strategy 'zero3'; valid: auto, ddp, fsdp"):
        rank_strategy("zero3")


def _tensor_parallel(x: StepInput) -> StepCost:
    # Two activation all-reduces per layer, as a tensor-parallel block would need.
    size = x.batch_size * x.shape.n_embd * x.comm_bytes
    n = 2 * x.shape.n_layer
    return StepCost("TP", (Collective("all_reduce", n * size, n),), ("all_reduce", size))


TP = StrategyRecord(
    name="toy-tp",
    description="tensor parallel (test only)",
    sharded=True,
    cost=_tensor_parallel,
    replicas=lambda devices: 1,  # one stream, split across the ranks
    message_sizes=lambda config, dtype_bytes, batch: MessageSizes((), (7 * batch,)),
    runs_on=frozenset({"cuda"}),
    min_ranks=2,
)


def test_perfmodel_predicts_the_record_it_is_given() -> None:
    """perfmodel looks no name up: the record is the argument, registered or not."""
    cfg = PRESETS["llama-2-7b"]
    p = predict(cfg, TP, 2, LINKS, compute_time_s=0.01)
    assert p.strategy == "toy-tp" and p.implementation == "TP"
    assert p.collectives_per_token == 64 and p.terms["latency"] > 0
    assert 7 * 3 in message_sizes(cfg, [TP], 2, 2, batch=3).all_reduce
    # on one device nothing crosses a link
    one = predict(cfg, TP, 1, LINKS, compute_time_s=0.01).terms
    assert one["compute"] == 0.01 and sum(v for k, v in one.items() if k != "compute") == 0


def test_a_new_record_is_predicted_by_name_without_other_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(STRATEGIES, "toy-tp", TP)
    cfg = PRESETS["llama-2-7b"]
    assert predict_for(cfg, "toy-tp", 2, LINKS, compute_time_s=0.01) == predict(
        cfg, TP, 2, LINKS, compute_time_s=0.01
    )
    assert "toy-tp" in {q.strategy for q in predict_all_for(cfg, 2, LINKS, compute_time_s=0.01)}
    assert 7 * 3 in message_sizes_for(cfg, "toy-tp", 2, 2, batch=3).all_reduce


def test_perfmodel_names_no_strategy() -> None:
    """perfmodel asks the records; a strategy's name in its source would be a branch on it."""
    found = []
    for path in sorted(PERFMODEL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in STRATEGIES:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not found


def test_where_a_record_runs() -> None:
    assert TP.unsupported("cuda", 2) is None
    assert TP.unsupported("cpu", 2) == "strategy 'toy-tp' runs on cuda, not on 'cpu'"
    assert TP.unsupported("cuda", 1) == "strategy 'toy-tp' needs at least 2 ranks, got 1"
    assert all(r.unsupported("cpu", 1) is None for r in STRATEGIES.values())
    assert data_parallel(3) == 3


def test_unknown_strategy_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown strategy 'zero3'; valid: auto, ddp, fsdp"):
        get_strategy("zero3")
    with pytest.raises(ValueError, match="unknown strategy 'zero3'; valid: auto, ddp, fsdp"):
        predict_for(PRESETS["tiny"], "zero3", 2, LINKS)


def test_fsdp1_wraps_the_contexts_units() -> None:
    """On CUDA, `fsdp` is FSDP1 with the built model's block class as its unit (no global)."""

    class MyBlock:
        pass

    strategy = rank_strategy("fsdp").build(BuildContext(CUDA, 2, wrap_units=(MyBlock,)))
    assert type(strategy).__name__ == "FSDPStrategy"
    policy = strategy._fsdp_kwargs["auto_wrap_policy"]
    assert policy(module=MyBlock(), recurse=False, nonwrapped_numel=1)
    assert not policy(module=object(), recurse=False, nonwrapped_numel=1)
    assert policy(module=object(), recurse=True, nonwrapped_numel=1)
    other = rank_strategy("fsdp").build(BuildContext(CUDA, 2, wrap_units=()))
    assert not other._fsdp_kwargs["auto_wrap_policy"](
        module=MyBlock(), recurse=False, nonwrapped_numel=1
    )
    cpu = rank_strategy("fsdp").build(BuildContext(CPU, 2, wrap_units=(MyBlock,)))
    assert type(cpu).__name__ == "ModelParallelStrategy"


def test_describe_implementation_reads_the_rank_half() -> None:
    class Fabric:
        strategy = object()

    class Wrapper:
        _forward_module = object()

    ran = RankStrategy("toy-tp", build=lambda c: "auto", describe_sharding=lambda f, m: "TP 2-way")
    assert ran.describe_implementation(Fabric(), Wrapper()) == ("object", "TP 2-way", "object")
    own = replace(ran, wrap=lambda model, context: model)
    assert own.describe_implementation(Fabric(), Wrapper())[0] == "object (launch only)"


def test_message_sizes_are_the_models_own() -> None:
    cfg = PRESETS["cpu-110m"]
    sharded = message_sizes_for(cfg, "fsdp", 2, 4)
    assert cfg.block_param_count() * 4 in sharded.all_gather
    assert cfg.non_block_param_count() * 4 in sharded.all_gather
    assert cfg.n_embd * 4 in sharded.all_reduce
    assert min(sharded.all_gather) <= LATENCY_PROBE_BYTES
    replicated = message_sizes_for(cfg, "auto", 2, 4, batch=3)
    assert max(replicated.all_gather) == max(3 * cfg.n_embd * 4, LATENCY_PROBE_BYTES)
    both = message_sizes_for(cfg, ["auto", "fsdp-noreshard"], 2, 4)
    assert both.all_gather == sharded.all_gather


def test_relative_speed_by_default_only_where_the_strategy_changes_what_runs() -> None:
    # Sharded and model-parallel strategies run other work than the bare model: measured by
    # default; replicated ones are the bare model behind a forward wrapper: on request only.
    changes = {name: get_strategy(name).changes_what_runs for name in strategy_names()}
    assert changes == {
        "auto": False,
        "ddp": False,
        "fsdp": True,
        "fsdp2": True,
        "fsdp-noreshard": True,
        "tp": True,
        "pipeline": True,
    }
    assert not get_strategy("auto").measures_relative_speed(asked=False, devices=2)
    assert get_strategy("ddp").measures_relative_speed(asked=True, devices=2)
    assert get_strategy("fsdp-noreshard").measures_relative_speed(asked=False, devices=2)
    # one rank splits nothing: only the wrapper's hooks would be measured, so only on request
    assert not get_strategy("fsdp").measures_relative_speed(asked=False, devices=1)
    assert get_strategy("fsdp").measures_relative_speed(asked=True, devices=1)
