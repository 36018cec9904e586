"""The strategy registry: name -> `StrategyRecord`, built from one module per family.

Torch-free, so that the plugin can validate markers at collection and the performance model can
predict; torch and Lightning are imported only when a rank builds a strategy. Adding a strategy:
a record in its family's module (or a new module) and, for a new module, one line below
(docs/extending.md).
"""

from __future__ import annotations

from pytest_distperf.strategies import fsdp, pipeline, replicated, tp
from pytest_distperf.strategies.record import BuildContext, StrategyRecord

__all__ = ["STRATEGIES", "BuildContext", "StrategyRecord", "get_strategy", "strategy_names"]

STRATEGIES: dict[str, StrategyRecord] = {
    record.name: record
    for record in (
        *replicated.RECORDS,
        *fsdp.RECORDS,
        *tp.RECORDS,
        *pipeline.RECORDS,
    )
}


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def get_strategy(name: str) -> StrategyRecord:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None
