"""Pipeline parallelism over all ranks (`pipeline`), LitGPT's sequentially.py split across
processes: each rank holds contiguous blocks, every forward sends the activation rank to rank
and the last rank sends the sampled token back; one stream, so no stage overlaps another."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import MessageSizes
from pytest_distperf.perfmodel.step import Collective, StepCost
from pytest_distperf.perfmodel.terms import GB
from pytest_distperf.strategies.record import StrategyRecord, model_parallel
from pytest_distperf.strategies.tp import activation_bytes

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import StepInput

TOKEN_BYTES = 8  # one int64 token id per batch row
TRAIN_REFUSAL = (
    "the built-in pipeline passes activations forward for decoding only: it has no backward "
    "schedule (no gradients sent back stage to stage, no micro-batches), so it cannot train; "
    "use fsdp, ddp or tp"
)


def check(config: ModelShape, devices: int) -> str | None:
    """Every stage needs at least one block."""
    if config.n_layer < devices:
        return (
            f"strategy 'pipeline' gives every rank at least one block: n_layer="
            f"{config.n_layer} is fewer than {devices} ranks"
        )
    return None


def cost(x: StepInput) -> StepCost:
    """A decode step's hops, none overlappable: the activation stage to stage, the token back."""
    n = x.devices
    activation = activation_bytes(x.shape, x.comm_bytes, x.batch_size)
    token = x.batch_size * TOKEN_BYTES
    hops = n - 1
    across = x.links.hops_across_nodes(n)  # stages on different nodes: the network between
    # One stage keeps its token: there is no hop back either (priced at nothing on one rank).
    # The last stage's node is the first's only when all stages share one node.
    chain = (
        (hops - across, activation, False),
        (across, activation, True),
        (1, token, x.links.crosses_nodes(n)),
    )
    sends = tuple(
        Collective("p2p", calls * nbytes, calls, overlappable=False, across_nodes=network)
        for calls, nbytes, network in chain
        if calls
    )
    if x.links.p2p_measured:
        basis = "pipeline hops: send/recv measured in the ranks"
    else:
        basis = (
            "pipeline hops: no send/recv measured; each at the link's all-gather bus bandwidth "
            f"({x.links.busbw / GB:.3g} GB/s) and small-collective latency "
            f"({x.links.latency_s * 1e6:.3g} us), which errs slow"
        )
    crossing = f"pipeline: {across} of the {hops} hop(s) and the token back cross the network"
    return StepCost(
        f"pipeline {n} stages (send/recv)",
        sends,
        ("p2p", activation),
        (
            f"pipeline: the whole model's compute in turn, {hops} hop(s) of the {activation} B "
            f"activation and the {token} B token back per token; one stream, so no stage "
            "overlaps another",
            basis,
            *((crossing,) if across else ()),
        ),
        hidden_behind=0.0,
    )


def _message_sizes(config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes:
    hops = (batch * TOKEN_BYTES, activation_bytes(config, dtype_bytes, batch))
    return MessageSizes((), (), tuple(sorted(set(hops))))


RECORDS = (
    StrategyRecord(
        name="pipeline",
        description="pipeline over all ranks: contiguous blocks per rank, activations "
        "sent rank to rank",
        sharded=True,
        changes_what_runs=True,
        cost=cost,
        replicas=model_parallel,
        message_sizes=_message_sizes,
        check=check,
        decodes_across_ranks=True,
        train_refusal=TRAIN_REFUSAL,
    ),
)
