"""A run's counted collectives in its prediction: what the ranks really issued per decode token
(ranks/counting.py), charged at the calibrated links in place of what the strategy's cost model
expects, and both shown side by side. Pure; docs/perfmodel.md ("Counted collectives").

Only the collectives on every token's path from the rank's own counts are charged this way:
all-gathers, all-reduces and reduce-scatters, which every rank issues alike. A pipeline's hops
chain through the ranks, so one rank's sends and receives do not show the path's length: its
hops stay the strategy's, and are only compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pytest_distperf.perfmodel.calibration import bus_factor
from pytest_distperf.perfmodel.cost import StrategyCost, StrategyInput

#: kind -> (calls, bytes) per decode token, bytes in nccl-tests' convention (work.py)
Collectives = Mapping[str, tuple[float, float]]

# The calibrated figures that time each counted kind: a ring reduce-scatter moves what an
# all-gather of the same size moves, (n-1)/n of its bytes through each link.
CHARGED_AS = {
    "all_gather": "all_gather",
    "all_reduce": "all_reduce",
    "reduce_scatter": "all_gather",
}
# The strategy cost's byte figure of each kind it charges (StrategyCost.bytes_per_token).
_BYTES_KEY = {
    "all_gather": "all_gather_output",
    "all_reduce": "all_reduce_bytes",
    "p2p": "p2p_bytes",
}
SAME_BYTES = 0.01  # counts are exact; bytes may differ by rounding to whole elements per rank


def expected_collectives(cost: StrategyCost) -> dict[str, tuple[float, float]]:
    """What the strategy's cost model charges per token (a training cost: per step), by kind (a
    pipeline's hops as "send/recv")."""
    if cost.by_kind:
        return dict(cost.by_kind)
    if not cost.collectives:
        return {}
    kind = "send/recv" if cost.message_op == "p2p" else cost.message_op
    return {kind: (cost.collectives, cost.bytes_per_token.get(_BYTES_KEY[cost.message_op], 0.0))}


def with_counted(cost: StrategyCost, counted: Collectives, x: StrategyInput) -> StrategyCost:
    """`cost` with its collectives as counted, where the counts differ from what it charges."""
    charged = {k: v for k, v in counted.items() if k in CHARGED_AS and v[0] > 0}
    expected = {k: v for k, v in expected_collectives(cost).items() if k in CHARGED_AS}
    if same_collectives(expected, charged):
        return cost
    terms = dict(cost.terms)
    moved = dict(cost.bytes_per_token)
    if cost.message_op in CHARGED_AS:  # its latency term is that collective's alone
        for name in ("all_gather", "all_reduce", "latency"):
            terms.pop(name, None)
        moved.pop(_BYTES_KEY[cost.message_op], None)
    hops = cost.collectives if cost.message_op == "p2p" else 0
    for kind, (calls, nbytes) in sorted(charged.items()):
        transfer, latency = x.links.collective_time(CHARGED_AS[kind], nbytes / calls, x.devices)
        terms[kind] = terms.get(kind, 0.0) + calls * transfer
        terms["latency"] = terms.get("latency", 0.0) + calls * latency
        moved[f"{kind}_bytes" if kind != "all_gather" else "all_gather_output"] = nbytes
    if "all_gather" in charged:
        received = charged["all_gather"][1] * bus_factor("all_gather", x.devices)
        moved["all_gather_received"] = received if x.devices > 1 else 0.0
    note = (
        f"collectives as counted in this run's ranks ({describe(charged)} per token), not as "
        f"the strategy's model expects ({describe(expected) or 'none'})"
    )
    calls = int(sum(c for c, _ in charged.values())) + hops
    return replace(cost, terms=terms, bytes_per_token=moved, collectives=calls,
                   assumptions=(note, *cost.assumptions))  # fmt: skip


def describe(collectives: Collectives) -> str:
    """E.g. "all_gather 7 x 8.04 MB, all_reduce 6 x 64 B" (bytes per call)."""
    return ", ".join(
        f"{kind} {calls:g} x {_size(nbytes / calls if calls else 0.0)}"
        for kind, (calls, nbytes) in sorted(collectives.items())
    )


def same_collectives(expected: Collectives, counted: Collectives) -> bool:
    """The same kinds, calls and (within `SAME_BYTES`) bytes."""
    if expected.keys() != counted.keys():
        return False
    for kind, (calls, nbytes) in expected.items():
        counted_calls, counted_bytes = counted[kind]
        if calls != counted_calls or abs(counted_bytes - nbytes) > SAME_BYTES * max(nbytes, 1.0):
            return False
    return True


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
