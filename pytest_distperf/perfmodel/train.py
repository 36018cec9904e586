"""The predicted time of one distributed training step (forward, backward, AdamW) as a sum of
named terms in SECONDS PER STEP, and the message sizes worth calibrating for it. Pure.

The compute every strategy pays is here: a measured single-process step of the whole model, or
its model FLOPs at the measured matmul rate (plus AdamW's memory traffic). A strategy's own
terms (gradient all-reduce, all-gathers, reduce-scatters, activation all-reduces) come from its
record's `train_cost`, never from a branch on its name here; a record without one cannot train
and says why (`train_refusal`). The terms and their assumptions: docs/perfmodel.md ("Training
step").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Protocol

from pytest_distperf.perfmodel.calibration import LATENCY_PROBE_BYTES, MessageSizes, bus_factor
from pytest_distperf.perfmodel.counted import (
    CHARGED_AS,
    Collectives,
    describe,
    expected_collectives,
    same_collectives,
)
from pytest_distperf.perfmodel.network import network_charge
from pytest_distperf.perfmodel.predict import Prediction, counted_overlap
from pytest_distperf.perfmodel.terms import DEFAULT_OVERHEADS, GB, LINK_TERMS, Overheads

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.cost import StrategyCost
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.shape import ModelShape

# Backward is two matmuls per forward one (the input's and the weight's gradient): 2/3 of the
# forward+backward FLOPs, the window in which DDP's bucketed all-reduces can run.
BACKWARD_SHARE = 2 / 3
# AdamW (foreach) per parameter reads param, grad, exp_avg and exp_avg_sq and writes param,
# exp_avg and exp_avg_sq, all in the parameter's dtype: 7 x param_bytes moved.
ADAMW_ACCESSES = 7
# Terms that run on the collectives' side: the transfer path that may hide behind compute.
TRANSFER_TERMS = frozenset(
    {"all_gather", "reduce_scatter", "all_reduce", "grad_all_reduce", "latency", "gather_copies"}
)
# Host-path terms during forward and backward (the optimizer runs after the last reduction).
WINDOW_TERMS = ("compute", "fsdp_overhead")


@dataclass(frozen=True)
class TrainInput:
    """Everything a strategy's training cost may look at (one data-parallel rank's view).

    `batch_size` sequences of `seq_length` tokens per data-parallel rank per step;
    `param_bytes` per stored parameter (4 for fp32 and bf16-mixed, 2 for bf16/fp16);
    `comm_bytes` per element the collectives move (FSDP's gathers and gradient reductions, DDP's
    gradient buckets, tp's activation all-reduces; the caller's choice, e.g. bf16-mixed: 2 for
    FSDP's MixedPrecision and autocast activations, 4 for DDP's fp32 gradients);
    `step_compute_s` a measured single-process step of the whole model on one rank's batch,
    timed on each rank before wrapping with the ranks side by side (the compute term when
    known); `matmul_flops_per_s` this rank's measured dense matmul rate (else model FLOPs over
    it).
    """

    shape: ModelShape
    devices: int
    device_type: str  # "cpu" or "cuda"
    batch_size: int
    seq_length: int
    param_bytes: int
    comm_bytes: int
    links: Links
    overheads: Overheads
    step_compute_s: float | None = None
    matmul_flops_per_s: float | None = None

    @property
    def tokens(self) -> int:
        """Tokens of one data-parallel rank's batch."""
        return self.batch_size * self.seq_length


class TrainSource(Protocol):
    """What `predict_train` and `train_message_sizes` read of a strategy's record."""

    @property
    def name(self) -> str: ...

    @property
    def train_cost(self) -> Callable[[TrainInput], StrategyCost] | None: ...

    @property
    def train_refusal(self) -> str: ...

    @property
    def train_message_sizes(
        self,
    ) -> Callable[[ModelShape, int, int, int, int], MessageSizes] | None:
        """(shape, param_bytes, comm_bytes, batch_size, seq_length) -> sizes to calibrate."""
        ...

    def replicas(self, devices: int) -> int: ...


# --------------------------------------------------------------------------- model FLOPs


def matmul_params(shape: ModelShape) -> int:
    """Parameters that take part in a matmul: every block's and the head's (the embedding is a
    lookup; a head tied to it still multiplies)."""
    return shape.n_layer * shape.block_param_count() + shape.padded_vocab_size * shape.n_embd


def flops_split(shape: ModelShape, batch_size: int, seq_length: int) -> tuple[float, float]:
    """(blocks, head) model FLOPs of one training step: what tensor parallelism splits and what
    every rank computes whole."""
    tokens = batch_size * seq_length
    blocks = shape.n_layer * shape.block_param_count()
    attention = 12 * shape.n_layer * shape.n_head * shape.head_size * seq_length * tokens
    head = shape.padded_vocab_size * shape.n_embd
    return float(6 * blocks * tokens + attention), float(6 * head * tokens)


def model_flops_per_step(shape: ModelShape, batch_size: int, seq_length: int) -> float:
    """PaLM/Megatron "model FLOPs" of one training step on one data-parallel rank's batch:
    6 x parameters (all blocks + the head; the embedding lookup is no matmul) x tokens, plus
    the attention matmuls 12 x n_layer x n_head x head_size x seq_length x tokens, FULL (not
    halved for the causal mask, as PaLM counts them). Forward + backward = 3 x forward; no
    recomputation, no optimizer. What MFU divides by."""
    blocks, head = flops_split(shape, batch_size, seq_length)
    return blocks + head


def adamw_bytes(shape: ModelShape, param_bytes: int) -> float:
    """Bytes AdamW moves to update every parameter once (`ADAMW_ACCESSES` x param_bytes each)."""
    params = shape.n_layer * shape.block_param_count() + shape.non_block_param_count()
    return float(ADAMW_ACCESSES * params * param_bytes)


# --------------------------------------------------------------------------- the prediction


def _compute_terms(x: TrainInput) -> tuple[dict[str, float], tuple[str, ...]]:
    """The whole model's step on one rank: measured, or model FLOPs at the matmul rate."""
    if x.step_compute_s is not None:
        note = (
            f"compute: measured single-process training step {x.step_compute_s * 1e3:.4g} ms "
            "(forward, backward, AdamW of the whole model; no overlap assumed inside it)"
        )
        return {"compute": x.step_compute_s}, (note,)
    assert x.matmul_flops_per_s is not None  # _check_arguments
    flops = model_flops_per_step(x.shape, x.batch_size, x.seq_length)
    terms = {"compute": flops / x.matmul_flops_per_s}
    notes = [
        f"compute: {flops / 1e12:.4g} model TFLOPs per step at {x.matmul_flops_per_s / 1e12:.4g} "
        "TFLOP/s (every matmul at the measured dense rate: no kernel, norm or softmax overhead, "
        "which errs fast)"
    ]
    bandwidth = x.links.memory_bandwidth
    moved = adamw_bytes(x.shape, x.param_bytes)
    if bandwidth:
        terms["optimizer"] = moved / bandwidth
        notes.append(f"optimizer: AdamW moves {moved / GB:.3g} GB at {bandwidth / GB:.4g} GB/s")
    else:
        notes.append("optimizer: not counted (no memory bandwidth known)")
    return terms, tuple(notes)


def _check_arguments(name: str, x: TrainInput) -> None:
    if x.devices < 1:
        raise ValueError(f"devices must be >= 1, got {x.devices}")
    for what in ("batch_size", "seq_length", "param_bytes", "comm_bytes"):
        value = getattr(x, what)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive int, got {value!r}")
    if x.step_compute_s is None and x.matmul_flops_per_s is None:
        raise ValueError(
            f"strategy {name!r}: a training prediction needs step_compute_s (a measured "
            "single-process step) or matmul_flops_per_s (a measured matmul rate); got neither"
        )
    for what in ("step_compute_s", "matmul_flops_per_s"):
        value = getattr(x, what)
        if value is not None and not (0 < value < math.inf):
            raise ValueError(f"{what} must be > 0 and finite, got {value!r}")


def _term_for(kind: str, terms: dict[str, float]) -> str:
    # DDP charges its all-reduce as "grad_all_reduce"; counted all-reduces keep that name.
    if kind == "all_reduce" and "grad_all_reduce" in terms:
        return "grad_all_reduce"
    return kind


def with_counted_step(cost: StrategyCost, counted: Collectives, x: TrainInput) -> StrategyCost:
    """`cost` with its collectives as the ranks counted them in one step, where the counts
    differ from what it expects: every collective term and the latency replaced by theirs, each
    call at the calibrated time of its size (a reduce-scatter at an all-gather's figures)."""
    charged = {k: v for k, v in counted.items() if k in CHARGED_AS and v[0] > 0}
    expected = {k: v for k, v in expected_collectives(cost).items() if k in CHARGED_AS}
    if same_collectives(expected, charged):
        return cost
    names = {kind: _term_for(kind, cost.terms) for kind in charged}
    terms = {k: v for k, v in cost.terms.items() if k not in LINK_TERMS}
    moved = {k: v for k, v in cost.bytes_per_token.items() if k == "gather_copies"}
    for kind, (calls, nbytes) in sorted(charged.items()):
        transfer, latency = x.links.collective_time(CHARGED_AS[kind], nbytes / calls, x.devices)
        terms[names[kind]] = terms.get(names[kind], 0.0) + calls * transfer
        terms["latency"] = terms.get("latency", 0.0) + calls * latency
        moved["all_gather_output" if kind == "all_gather" else f"{kind}_bytes"] = nbytes
    if "all_gather" in charged:
        received = charged["all_gather"][1] * bus_factor("all_gather", x.devices)
        moved["all_gather_received"] = received
    note = (
        f"collectives as counted in this run's ranks ({describe(charged)} per step), not as "
        f"the strategy's model expects ({describe(expected) or 'none'})"
    )
    calls = int(sum(c for c, _ in charged.values()))
    return replace(cost, terms=terms, bytes_per_token=moved, collectives=calls,
                   by_kind=dict(charged), assumptions=(note, *cost.assumptions))  # fmt: skip


def _overlap(terms: dict[str, float], cost: StrategyCost, overlap: float) -> tuple[float, str]:
    """Seconds of the transfer path hidden behind the compute window, and why.

    The transfers run on the collectives' stream (DDP's buckets during backward, FSDP's
    prefetched gathers and its reduce-scatters during both passes); `cost.exposed_s` of them
    (the first gather, the last bucket or reduce-scatter) has nothing to hide behind. How much a
    machine really hides is `overlap`, measured in the ranks (0 without a calibration: terms
    add up, which errs slow; gloo ranks sharing a few cores measure little).
    """
    if not cost.overlappable or overlap <= 0:
        return 0.0, ""
    window = cost.hidden_behind * sum(terms.get(k, 0.0) for k in WINDOW_TERMS)
    transfer = sum(v for k, v in terms.items() if k in TRANSFER_TERMS)
    hidden = overlap * min(window, max(0.0, transfer - cost.exposed_s))
    note = (
        f"overlap: {overlap:.0%} (measured) of the transfers, less the {cost.exposed_s * 1e3:.3g}"
        f" ms nothing can hide (the first gather, the last reduction), hidden behind "
        f"{cost.hidden_behind:.2g} of the compute: {hidden * 1e3:.3g} ms per step"
    )
    return hidden, note


def _train_cost_of(record: TrainSource) -> Callable[[TrainInput], StrategyCost]:
    if record.train_cost is None:
        reason = record.train_refusal or "its record has no training cost"
        raise ValueError(f"strategy {record.name!r} cannot train: {reason}")
    return record.train_cost


def predict_train(
    shape: ModelShape,
    record: TrainSource,
    devices: int,
    links: Links,
    *,
    device_type: str,
    batch_size: int,
    seq_length: int,
    param_bytes: int,
    comm_bytes: int,
    step_compute_s: float | None = None,
    matmul_flops_per_s: float | None = None,
    overheads: Overheads = DEFAULT_OVERHEADS,
    counted_collectives: Collectives | None = None,
) -> Prediction:
    """Predicted training tokens/sec of `record`'s strategy on `devices` ranks; terms in
    seconds per step. `counted_collectives`: kind -> (calls, bytes) per step counted in the
    ranks; where they differ from what the strategy's model expects, they are charged instead.
    Raises ValueError when the strategy cannot train or no compute figure is given."""
    cost_of = _train_cost_of(record)
    x = TrainInput(shape, devices, device_type, batch_size, seq_length, param_bytes, comm_bytes,
                   links, overheads, step_compute_s, matmul_flops_per_s)  # fmt: skip
    _check_arguments(record.name, x)
    terms, notes = _compute_terms(x)
    cost = _step_cost(cost_of, x, counted_collectives)
    expected = expected_collectives(cost_of(x))
    network = network_charge(links, cost, partial(_step_cost, cost_of, x, counted_collectives))
    if cost.compute_share != 1.0:
        terms["compute"] *= cost.compute_share
        notes += (f"compute x {cost.compute_share:.3g}: one rank's share ({cost.implementation})",)
    if "optimizer" in terms and cost.optimizer_share != 1.0:
        terms["optimizer"] *= cost.optimizer_share
        notes += (f"optimizer x {cost.optimizer_share:.3g}: this rank's parameters",)
    if overheads.note and "fsdp_overhead" in cost.terms:
        notes += (overheads.note,)
    terms.update(cost.terms)
    if devices == 1:  # nothing crosses a link
        terms = {k: v for k, v in terms.items() if k not in LINK_TERMS or v}
    overlap, no_overlap = counted_overlap(links.overlap, device_type)
    notes += no_overlap
    hidden, why = _overlap(terms, cost, overlap)
    if hidden:
        terms["overlap"] = -hidden
        notes += (why,)
    step = sum(terms.values())
    tokens = record.replicas(devices) * batch_size * seq_length
    return Prediction(
        strategy=record.name,
        devices=devices,
        tokens_per_sec=tokens / step if step > 0 else math.inf,
        time_per_token_s=step / tokens,
        terms=terms,
        bound=max(terms, key=lambda k: terms[k]),
        bytes_per_token=dict(cost.bytes_per_token),
        link_class=links.link_class,
        bandwidth_used=links.busbw_at(cost.message_op, cost.message_bytes),
        assumptions=(
            "terms in seconds per training step",
            *notes,
            *cost.assumptions,
            *links.assumptions,
        ),
        implementation=cost.implementation,
        measured_links=links.measured,
        collectives_per_token=cost.collectives,
        batch_size=batch_size,
        expected_collectives=expected,
        counted_collectives=None if counted_collectives is None else dict(counted_collectives),
        mode="train",
        step_time_s=step,
        tokens_per_step=tokens,
        network=network,
    )


def _step_cost(
    cost_of: Callable[[TrainInput], StrategyCost],
    x: TrainInput,
    counted: Collectives | None,
    links: Links | None = None,
) -> StrategyCost:
    """The record's step cost (on `links`, given), with the counted collectives where counted."""
    x = x if links is None else replace(x, links=links)
    cost = cost_of(x)
    return cost if counted is None else with_counted_step(cost, counted, x)


def train_message_sizes(
    shape: ModelShape,
    records: Iterable[TrainSource],
    devices: int,
    param_bytes: int,
    comm_bytes: int,
    batch_size: int,
    seq_length: int,
) -> MessageSizes:
    """The collective sizes a training step really uses under `records` (those that can
    train): a latency probe, then each record's own (DDP's buckets, FSDP's unit gathers and
    reductions in comm_bytes, tp's activation all-reduces). Reduce-scatters are timed at the
    all-gather figures of their size, so they add all-gather sizes."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    gather = {LATENCY_PROBE_BYTES}
    reduce = {LATENCY_PROBE_BYTES}
    p2p: set[int] = set()
    for record in records:
        sizes_of = record.train_message_sizes
        if record.train_cost is None or sizes_of is None:
            continue
        own = sizes_of(shape, param_bytes, comm_bytes, batch_size, seq_length)
        gather.update(own.all_gather)
        reduce.update(own.all_reduce)
        p2p.update(own.p2p)
    return MessageSizes(tuple(sorted(gather)), tuple(sorted(reduce)), tuple(sorted(p2p)))
