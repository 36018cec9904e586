"""Fully sharded strategies: `fsdp`, `fsdp2`, `fsdp-noreshard`, one unit per transformer block.

On CUDA `fsdp` is FSDP1 FULL_SHARD per block (the seed's setup); Fabric's FSDP refuses CPU, so
there it is FSDP2's `fully_shard` per block on gloo, which `fsdp2` is everywhere. What each
gathers per forward, and why: docs/perfmodel.md ("Strategies"). The rank half (builds):
`pytest_distperf.ranks.strategies.fsdp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import MessageSizes, bus_factor
from pytest_distperf.perfmodel.cost import StrategyCost
from pytest_distperf.perfmodel.terms import MB
from pytest_distperf.strategies.record import CPU_AND_CUDA, StrategyRecord, data_parallel

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.cost import StrategyInput
    from pytest_distperf.perfmodel.shape import ModelShape

# --------------------------------------------------------------------------- cost terms


def _gathered_weights(config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes:
    """One block's and the root's (embedding, final norm, head) gathered weights."""
    block = config.block_param_count() * dtype_bytes
    root = config.non_block_param_count() * dtype_bytes
    return MessageSizes(tuple(sorted({block, root})), ())


def _gathers(x: StrategyInput, sizes: Sequence[float]) -> tuple[dict[str, float], dict[str, float]]:
    """Terms and bytes of one all-gather per entry of `sizes` (gathered output bytes)."""
    transfer = latency = 0.0
    for size in sizes:
        t, lat = x.links.collective_time("all_gather", size, x.devices)
        transfer += t
        latency += lat
    out = float(sum(sizes))
    received = out * bus_factor("all_gather", x.devices) if x.devices > 1 else 0.0
    terms = {"all_gather": transfer, "latency": latency}
    return terms, {"all_gather_output": out, "all_gather_received": received}


def _fsdp1_full_shard(x: StrategyInput) -> StrategyCost:
    block = x.config.block_param_count() * x.dtype_bytes
    sizes = [block] * x.config.n_layer
    terms, moved = _gathers(x, sizes)
    units = x.config.n_layer + 1
    terms["fsdp_overhead"] = units * x.overheads.fsdp1_unit_s
    return StrategyCost(
        "FSDP1 FULL_SHARD",
        terms,
        moved,
        len(sizes),
        block,
        (
            f"FSDP1: every block gathered every forward ({x.config.n_layer} all-gathers of "
            f"{block / MB:.4g} MB); the root unit is kept after its first gather",
            f"FSDP1 per-unit overhead {x.overheads.fsdp1_unit_s * 1e3:g} ms x {units} units",
        ),
    )


def _fsdp2(reshard: bool, x: StrategyInput) -> StrategyCost:
    block = x.config.block_param_count() * x.dtype_bytes
    root = x.config.non_block_param_count() * x.dtype_bytes
    units = x.config.n_layer + 1
    o = x.overheads
    if not reshard:
        return StrategyCost(
            "FSDP2 reshard_after_forward=False",
            {"fsdp_overhead": units * o.fsdp2_unit_s},
            {"all_gather_output": 0.0, "all_gather_received": 0.0},
            0,
            block,
            (
                "FSDP2 no reshard: weights gathered once in warm-up and kept (no backward "
                "reshards them), so no per-token collective",
                f"FSDP2 per-unit overhead {o.fsdp2_unit_s * 1e3:g} ms x {units} units",
            ),
        )
    sizes = [block] * x.config.n_layer + [root]
    terms, moved = _gathers(x, sizes)
    per_unit = o.fsdp2_unit_s + o.fsdp2_gather_s
    terms["fsdp_overhead"] = units * per_unit
    # FSDP2 copies the local shards into the all-gather input (S/n) and the gathered buffer out
    # into per-parameter tensors (S), both newly allocated; a copy of S bytes moves 2S.
    copied = 2 * sum(sizes) * (1 + 1 / x.devices)
    bandwidth = x.links.fresh_copy_bandwidth
    terms["gather_copies"] = copied / bandwidth if bandwidth else 0.0
    moved["gather_copies"] = copied
    return StrategyCost(
        "FSDP2 reshard_after_forward=True",
        terms,
        moved,
        len(sizes),
        block,
        (
            f"FSDP2: every block ({block / MB:.4g} MB) and the root ({root / MB:.4g} MB) "
            "gathered every forward (an explicit reshard_after_forward=True reshards the root)",
            f"FSDP2 per-unit overhead ({o.fsdp2_unit_s * 1e3:g} + {o.fsdp2_gather_s * 1e3:g} "
            f"ms gathering) x {units} units",
        ),
    )


def _fsdp_cost(x: StrategyInput) -> StrategyCost:
    # As the rank half builds it: FSDP1 on CUDA, FSDP2 elsewhere.
    return _fsdp1_full_shard(x) if x.device_type == "cuda" else _fsdp2(True, x)


# --------------------------------------------------------------------------- records

_fsdp = partial(
    StrategyRecord,
    family="fsdp",
    sharded=True,
    replicas=data_parallel,
    message_sizes=_gathered_weights,
    runs_on=CPU_AND_CUDA,
    min_ranks=1,
)

RECORDS = (
    _fsdp(
        name="fsdp",
        description="full sharding, weights all-gathered every forward "
        "(CUDA: FSDP1 per block; CPU: FSDP2)",
        cost=_fsdp_cost,
    ),
    _fsdp(
        name="fsdp2",
        description="FSDP2 fully_shard per block, resharded after every forward",
        cost=partial(_fsdp2, True),
    ),
    _fsdp(
        name="fsdp-noreshard",
        description="FSDP2 sharded storage; gathered weights kept across steps "
        "(no per-token gather)",
        cost=partial(_fsdp2, False),
    ),
)
