"""The strategies' rank halves by name (one module per family, as the pure records in
`pytest_distperf.strategies`): `rank_strategy(name).build(BuildContext(...))`."""

from __future__ import annotations

from pytest_distperf.ranks.strategies import fsdp, pipeline, replicated, tp
from pytest_distperf.ranks.strategies.half import BuildContext, RankStrategy

__all__ = ["RANK_STRATEGIES", "BuildContext", "RankStrategy", "rank_strategy"]

RANK_STRATEGIES: dict[str, RankStrategy] = {
    half.name: half for half in (*replicated.HALVES, *fsdp.HALVES, *tp.HALVES, *pipeline.HALVES)
}


def rank_strategy(name: str) -> RankStrategy:
    """The rank half of strategy `name`; ValueError naming the valid names otherwise."""
    try:
        return RANK_STRATEGIES[name]
    except KeyError:
        valid = ", ".join(RANK_STRATEGIES)
        raise ValueError(f"unknown strategy {name!r}; valid: {valid}") from None
