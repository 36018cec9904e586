"""The strategy registry: name -> pure `StrategyRecord` (no torch, not even lazily), and the
performance model's functions by strategy name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pytest_distperf.perfmodel.predict import message_sizes, predict
from pytest_distperf.perfmodel.train import predict_train, train_message_sizes
from pytest_distperf.strategies import fsdp, pipeline, replicated, tp
from pytest_distperf.strategies.record import StrategyRecord

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.calibration import MessageSizes
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.prediction import Prediction
    from pytest_distperf.perfmodel.shape import ModelShape

STRATEGIES: dict[str, StrategyRecord] = {
    record.name: record
    for record in (*replicated.RECORDS, *fsdp.RECORDS, *tp.RECORDS, *pipeline.RECORDS)
}


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def get_strategy(name: str) -> StrategyRecord:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None


def _records(names: str | Iterable[str]) -> list[StrategyRecord]:
    return [get_strategy(n) for n in ((names,) if isinstance(names, str) else names)]


def message_sizes_for(
    shape: ModelShape, names: str | Iterable[str], devices: int, dtype_bytes: int, batch: int = 1
) -> MessageSizes:
    return message_sizes(shape, _records(names), devices, dtype_bytes, batch)


def predict_for(
    shape: ModelShape, name: str, devices: int, links: Links, **kwargs: Any
) -> Prediction:
    return predict(shape, get_strategy(name), devices, links, **kwargs)


def predict_all_for(
    shape: ModelShape, devices: int, links: Links, names: Iterable[str] | None = None, **kwargs: Any
) -> list[Prediction]:
    records = _records(strategy_names() if names is None else names)
    return [predict(shape, record, devices, links, **kwargs) for record in records]


def predict_train_for(
    shape: ModelShape, name: str, devices: int, links: Links, **kwargs: Any
) -> Prediction:
    return predict_train(shape, get_strategy(name), devices, links, **kwargs)


def train_message_sizes_for(
    shape: ModelShape,
    names: str | Iterable[str],
    devices: int,
    param_bytes: int,
    comm_bytes: int,
    batch_size: int,
    seq_length: int,
) -> MessageSizes:
    args = (devices, param_bytes, comm_bytes, batch_size, seq_length)
    return train_message_sizes(shape, _records(names), *args)
