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

from pytest_distperf import platform
from pytest_distperf.perfmodel.calibration import MessageSizes, bus_factor
from pytest_distperf.perfmodel.cost import StrategyCost
from pytest_distperf.perfmodel.terms import MB
from pytest_distperf.strategies.record import CPU_AND_CUDA, StrategyRecord, data_parallel

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.cost import StrategyInput
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.train import TrainInput

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
    overhead = f"FSDP1 per-unit overhead {x.overheads.fsdp1_unit_s * 1e3:g} ms x {units} units"
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
            overhead,
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


def fsdp_is_fsdp1(accelerator: str) -> bool:
    """What `fsdp` runs, decided by the Platform record: FSDP1 on CUDA, FSDP2 elsewhere."""
    return platform.fsdp_runs(accelerator) == "FSDP1"


def _fsdp_cost(x: StrategyInput) -> StrategyCost:
    return _fsdp1_full_shard(x) if fsdp_is_fsdp1(x.device_type) else _fsdp2(True, x)


# --------------------------------------------------------------------------- training step


def _train_units(x: TrainInput) -> tuple[float, float]:
    """One block's and the root's gathered bytes (gradients reduce the same), in comm_bytes."""
    block = x.shape.block_param_count() * x.comm_bytes
    return float(block), float(x.shape.non_block_param_count() * x.comm_bytes)


def _step_collectives(
    x: TrainInput, gathers: list[float], reductions: list[float]
) -> tuple[dict[str, float], dict[str, float], float, dict[str, tuple[float, float]]]:
    """Terms, bytes, exposed seconds and expected kinds of a step's gathers and reductions,
    each list in issue order. A ring reduce-scatter moves what an all-gather of its size moves:
    it is timed at the all-gather figures (the calibration measures no reduce-scatter)."""
    gathers = [g for g in gathers if g > 0]
    reductions = [r for r in reductions if r > 0]
    gathered = [x.links.collective_time("all_gather", g, x.devices) for g in gathers]
    reduced = [x.links.collective_time("all_gather", r, x.devices) for r in reductions]
    terms = {
        "all_gather": sum(t for t, _ in gathered),
        "reduce_scatter": sum(t for t, _ in reduced),
        "latency": sum(lat for _, lat in gathered + reduced),
    }
    out = sum(gathers)
    moved = {
        "all_gather_output": out,
        "all_gather_received": out * bus_factor("all_gather", x.devices),
        "reduce_scatter_bytes": float(sum(reductions)),
    }
    # The first gather has no compute before it, the last reduction none after it.
    exposed = sum(gathered[0]) if gathered else 0.0
    exposed += sum(reduced[-1]) if reduced else 0.0
    kinds = {"all_gather": (float(len(gathers)), out),
             "reduce_scatter": (float(len(reductions)), float(sum(reductions)))}  # fmt: skip
    return terms, moved, exposed, {k: v for k, v in kinds.items() if v[0]}


def _fsdp1_train(x: TrainInput) -> StrategyCost:
    block, root = _train_units(x)
    n_layer = x.shape.n_layer
    # FULL_SHARD: every unit gathered in forward; blocks again in backward (resharded after
    # forward), the root not (FSDP1 keeps the root gathered from forward to backward).
    gathers = [root] + [block] * (2 * n_layer)
    reductions = [block] * n_layer + [root]
    terms, moved, exposed, kinds = _step_collectives(x, gathers, reductions)
    units = n_layer + 1
    terms["fsdp_overhead"] = 2 * units * x.overheads.fsdp1_unit_s
    return StrategyCost(
        "FSDP1 FULL_SHARD",
        terms,
        moved,
        int(sum(c for c, _ in kinds.values())),
        block,
        (
            f"FSDP1 training: the root and {n_layer} blocks gathered in forward, the blocks "
            f"again in backward, {units} gradient reduce-scatters ({block / MB:.4g} MB a block)",
            f"FSDP1 per-unit overhead {x.overheads.fsdp1_unit_s * 1e3:g} ms x {units} units x 2 "
            "passes (fitted on decode forwards, not on training steps)",
            "FSDP: the next unit's gather prefetched behind this unit's compute, reductions "
            "behind the next unit's backward",
        ),
        exposed_s=exposed,
        optimizer_share=1 / x.devices,
        by_kind=kinds,
    )


def _fsdp2_train(reshard: bool, x: TrainInput) -> StrategyCost:
    block, root = _train_units(x)
    n_layer = x.shape.n_layer
    units = n_layer + 1
    # Forward gathers every unit (root first); resharded units are gathered again in backward.
    gathers = [root] + [block] * n_layer + ([block] * n_layer + [root] if reshard else [])
    reductions = [block] * n_layer + [root]
    terms, moved, exposed, kinds = _step_collectives(x, gathers, reductions)
    o = x.overheads
    collectives = len(gathers) + len(reductions)
    terms["fsdp_overhead"] = 2 * units * o.fsdp2_unit_s + collectives * o.fsdp2_gather_s
    # Copy-in and copy-out around every gather and every reduce-scatter (S and S/n each).
    copied = 2 * (sum(gathers) + sum(reductions)) * (1 + 1 / x.devices)
    bandwidth = x.links.fresh_copy_bandwidth
    terms["gather_copies"] = copied / bandwidth if bandwidth else 0.0
    moved["gather_copies"] = copied
    again = "gathered again in backward" if reshard else "kept gathered from forward to backward"
    return StrategyCost(
        f"FSDP2 reshard_after_forward={reshard}",
        terms,
        moved,
        int(sum(c for c, _ in kinds.values())),
        block,
        (
            f"FSDP2 training: the root and {n_layer} blocks gathered in forward and {again}; "
            f"{units} gradient reduce-scatters ({block / MB:.4g} MB a block)",
            f"FSDP2 per-unit overhead {o.fsdp2_unit_s * 1e3:g} ms x {units} units x 2 passes + "
            f"{o.fsdp2_gather_s * 1e3:g} ms x {collectives} gathers and reductions (fitted on "
            "decode forwards, not on training steps)",
            "FSDP: the next unit's gather prefetched behind this unit's compute, reductions "
            "behind the next unit's backward",
        ),
        exposed_s=exposed,
        optimizer_share=1 / x.devices,
        by_kind=kinds,
    )


def _fsdp_train(x: TrainInput) -> StrategyCost:
    return _fsdp1_train(x) if fsdp_is_fsdp1(x.device_type) else _fsdp2_train(True, x)


def _train_message_sizes(
    config: ModelShape, param_bytes: int, comm_bytes: int, batch_size: int, seq_length: int
) -> MessageSizes:
    """A block's and the root's gathers (and gradient reduce-scatters) in comm_bytes."""
    return _gathered_weights(config, comm_bytes, batch_size)


# --------------------------------------------------------------------------- records

_fsdp = partial(
    StrategyRecord,
    family="fsdp",
    sharded=True,
    replicas=data_parallel,
    message_sizes=_gathered_weights,
    runs_on=CPU_AND_CUDA,
    min_ranks=1,
    train_message_sizes=_train_message_sizes,
)

RECORDS = (
    _fsdp(
        name="fsdp",
        description="full sharding, weights all-gathered every forward "
        "(CUDA: FSDP1 per block; CPU: FSDP2)",
        cost=_fsdp_cost,
        train_cost=_fsdp_train,
    ),
    _fsdp(
        name="fsdp2",
        description="FSDP2 fully_shard per block, resharded after every forward",
        cost=partial(_fsdp2, True),
        train_cost=partial(_fsdp2_train, True),
    ),
    _fsdp(
        name="fsdp-noreshard",
        description="FSDP2 sharded storage; gathered weights kept across steps "
        "(no per-token gather)",
        cost=partial(_fsdp2, False),
        train_cost=partial(_fsdp2_train, False),
    ),
)
