"""Tensor parallelism over all ranks (`tp`), as LitGPT's generate/tp.py does it: heads and the
MLP's hidden dimension split (column-wise in, row-wise out), so every block all-reduces its
activation twice, after attention and after the MLP; the embedding and the head stay whole."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import MessageSizes
from pytest_distperf.perfmodel.shape import kv_cache_bytes
from pytest_distperf.perfmodel.step import Collective, StepCost
from pytest_distperf.perfmodel.train import flops_split
from pytest_distperf.strategies.record import StrategyRecord, model_parallel

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import StepInput


def check(config: ModelShape, devices: int) -> str | None:
    """Heads, query groups and the MLP's width must split evenly over the ranks."""
    for what in ("n_head", "n_query_groups", "intermediate_size"):
        size = getattr(config, what)
        if size % devices:
            return (
                f"strategy 'tp' splits attention heads and the MLP's hidden dimension over the "
                f"ranks: {what}={size} is not divisible by {devices} ranks"
            )
    return None


def compute_share(x: StepInput) -> float:
    """A rank's share of the work, 1/N of the blocks and the head whole: decode, of the bytes it
    streams (weights and KV cache); training, of the model FLOPs."""
    cfg = x.shape
    if x.training:
        blocks, head = flops_split(cfg, x.batch_size, x.seq_length)
        return (blocks / x.devices + head) / (blocks + head)
    blocks = cfg.n_layer * cfg.block_param_count() * x.comm_bytes
    head = cfg.padded_vocab_size * cfg.n_embd * x.comm_bytes
    kv = kv_cache_bytes(cfg, x.batch_size, x.seq_length, x.comm_bytes)
    return ((blocks + kv) / x.devices + head) / (blocks + kv + head)


def activation_bytes(config: ModelShape, dtype_bytes: int, batch: int, tokens: int = 1) -> int:
    """The activation each all-reduce (or hop) moves: batch x tokens x n_embd."""
    return batch * tokens * config.n_embd * dtype_bytes


def cost(x: StepInput) -> StepCost:
    """Per block 2 activation all-reduces every pass (in backward, the gradient of each split
    layer's input), none overlappable."""
    n, shape = x.devices, x.shape
    size = activation_bytes(shape, x.comm_bytes, x.batch_size, x.tokens_per_row)
    count = 2 * x.passes * shape.n_layer
    if x.training:
        params, others = shape.n_layer * shape.block_param_count(), shape.non_block_param_count()
        optimizer_share = (params / n + others) / (params + others)
        notes = (
            f"TP training: every rank computes 1/{n} of the blocks' model FLOPs (their matmuls "
            "and attention) and the head whole; norms and embedding whole on every rank",
            f"TP training: 4 all-reduces per block ({count} per step) of the {size} B "
            "activation (2 forward, 2 backward), each the next operation's input, so nothing "
            "hides behind them; replicated parameters need no gradient reduction",
        )
    else:
        optimizer_share = 1.0
        notes = (
            f"TP: every rank streams 1/{n} of the blocks and of the KV cache, and the "
            "head whole (replicated, as in LitGPT's tp.py)",
            f"TP: 2 all-reduces per block ({count} per token) of the {size} B activation, each "
            "the next layer's input, so nothing hides behind them",
        )
    return StepCost(
        f"TP {n}-way (by hand)",
        (Collective("all_reduce", float(count * size), count, overlappable=False),),
        ("all_reduce", size),
        notes,
        compute_share=compute_share(x),
        optimizer_share=optimizer_share,
        hidden_behind=0.0,
    )


def _message_sizes(config: ModelShape, dtype_bytes: int, batch: int) -> MessageSizes:
    return MessageSizes((), (activation_bytes(config, dtype_bytes, batch),))


RECORDS = (
    StrategyRecord(
        name="tp",
        description="tensor parallel over all ranks: heads and MLP split, 2 all-reduces "
        "per block (by hand, as LitGPT)",
        sharded=True,
        changes_what_runs=True,
        cost=cost,
        replicas=model_parallel,
        message_sizes=_message_sizes,
        check=check,
    ),
)
