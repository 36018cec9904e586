"""Fully sharded strategies, one unit per transformer block: `fsdp` (CUDA: FSDP1 FULL_SHARD per
block, the seed's setup; elsewhere Fabric refuses it, so FSDP2's `fully_shard` on gloo), `fsdp2`
and `fsdp-noreshard`. What each gathers, and why: docs/perfmodel.md ("Strategies")."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from pytest_distperf import platform
from pytest_distperf.perfmodel.calibration import MessageSizes
from pytest_distperf.perfmodel.step import Collective, StepCost
from pytest_distperf.perfmodel.terms import MB
from pytest_distperf.strategies.record import StrategyRecord

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import StepInput

OVERLAPPED = (
    "FSDP: the next unit's gather prefetched behind this unit's compute, reductions "
    "behind the next unit's backward"
)
# A sharded step reports its gathers' bytes, none included (fsdp-noreshard's decode).
NO_GATHERS = {"all_gather_output": 0.0, "all_gather_received": 0.0}


def _unit_bytes(shape: ModelShape, dtype_bytes: int) -> tuple[int, int]:
    """A block's and the root's (embedding, final norm, head) bytes, as gathered."""
    return shape.block_param_count() * dtype_bytes, shape.non_block_param_count() * dtype_bytes


def _gathered_weights(config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes:
    return MessageSizes(tuple(sorted(set(_unit_bytes(config, dtype_bytes)))), ())


def _sharded(
    x: StepInput,
    name: str,
    gathers: list[int],
    reductions: list[int],
    notes: tuple[str, ...],
    **host_work: Any,
) -> StepCost:
    """The all-gathers and gradient reduce-scatters in issue order (bytes each); every rank
    updates its shard. Nothing hides a training step's first gather nor its last reduction."""
    ops = [Collective("all_gather", g) for g in gathers if g > 0]
    ops += [Collective("reduce_scatter", r) for r in reductions if r > 0]
    if x.training and ops:
        ops[0] = Collective("all_gather", ops[0].bytes, overlappable=False)
        ops[-1] = Collective(ops[-1].kind, ops[-1].bytes, overlappable=False)
    message = ("all_gather", _unit_bytes(x.shape, x.comm_bytes)[0])
    share = 1 / x.devices
    return StepCost(
        name, tuple(ops), message, notes, moved=NO_GATHERS, optimizer_share=share, **host_work
    )


def _fsdp1(x: StepInput) -> StepCost:
    """FULL_SHARD: every block gathered every forward, and again in backward (resharded after
    forward); the root gathered once and kept, in training from forward to backward."""
    (block, root), n_layer = _unit_bytes(x.shape, x.comm_bytes), x.shape.n_layer
    units, unit_s = n_layer + 1, x.overheads.fsdp1_unit_s
    if x.training:
        gathers, reductions = [root] + [block] * (2 * n_layer), [block] * n_layer + [root]
        notes = (
            f"FSDP1 training: the root and {n_layer} blocks gathered in forward, the blocks "
            f"again in backward, {units} gradient reduce-scatters ({block / MB:.4g} MB a block)",
            f"FSDP1 per-unit overhead {unit_s * 1e3:g} ms x {units} units x 2 passes (fitted on "
            "decode forwards, not on training steps)",
            OVERLAPPED,
        )
    else:
        gathers, reductions = [block] * n_layer, []
        notes = (
            f"FSDP1: every block gathered every forward ({n_layer} all-gathers of "
            f"{block / MB:.4g} MB); the root unit is kept after its first gather",
            f"FSDP1 per-unit overhead {unit_s * 1e3:g} ms x {units} units",
        )
    return _sharded(x, "FSDP1 FULL_SHARD", gathers, reductions, notes, units=units, unit_s=unit_s)


def _fsdp2(reshard: bool, x: StepInput) -> StepCost:
    """fully_shard per block and on the root: every unit gathered in forward, resharded units
    again in backward; a training step reduce-scatters every unit's gradients."""
    (block, root), n_layer = _unit_bytes(x.shape, x.comm_bytes), x.shape.n_layer
    units, o = n_layer + 1, x.overheads
    if x.training:
        again = [block] * n_layer + [root] if reshard else []
        gathers, reductions = [root] + [block] * n_layer + again, [block] * n_layer + [root]
        kept = "gathered again in backward" if reshard else "kept gathered from forward to backward"
        notes: tuple[str, ...] = (
            f"FSDP2 training: the root and {n_layer} blocks gathered in forward and {kept}; "
            f"{units} gradient reduce-scatters ({block / MB:.4g} MB a block)",
            f"FSDP2 per-unit overhead {o.fsdp2_unit_s * 1e3:g} ms x {units} units x 2 passes + "
            f"{o.fsdp2_gather_s * 1e3:g} ms x {len(gathers) + len(reductions)} gathers and "
            "reductions (fitted on decode forwards, not on training steps)",
            OVERLAPPED,
        )
    elif reshard:
        gathers, reductions = [block] * n_layer + [root], []
        notes = (
            f"FSDP2: every block ({block / MB:.4g} MB) and the root ({root / MB:.4g} MB) "
            "gathered every forward (an explicit reshard_after_forward=True reshards the root)",
            f"FSDP2 per-unit overhead ({o.fsdp2_unit_s * 1e3:g} + {o.fsdp2_gather_s * 1e3:g} "
            f"ms gathering) x {units} units",
        )
    else:
        gathers, reductions = [], []
        notes = (
            "FSDP2 no reshard: weights gathered once in warm-up and kept (no backward "
            "reshards them), so no per-token collective",
            f"FSDP2 per-unit overhead {o.fsdp2_unit_s * 1e3:g} ms x {units} units",
        )
    name = f"FSDP2 reshard_after_forward={reshard}"
    host_work = {"units": units, "unit_s": o.fsdp2_unit_s, "collective_s": o.fsdp2_gather_s}
    return _sharded(x, name, gathers, reductions, notes, copies=True, **host_work)


def fsdp_is_fsdp1(accelerator: str) -> bool:
    """Whether `fsdp` runs FSDP1 there (CUDA) rather than FSDP2, as the Platform record says."""
    return platform.fsdp_runs(accelerator) == "FSDP1"


def _fsdp_cost(x: StepInput) -> StepCost:
    return _fsdp1(x) if fsdp_is_fsdp1(x.device_type) else _fsdp2(True, x)


_fsdp = partial(
    StrategyRecord, sharded=True, changes_what_runs=True, message_sizes=_gathered_weights
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
