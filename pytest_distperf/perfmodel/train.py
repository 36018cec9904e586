"""A training step (forward, backward, AdamW), terms in SECONDS PER STEP (`predict_train`), and
the sizes worth calibrating; docs/perfmodel.md ("Training step")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import LATENCY_PROBE_BYTES, MessageSizes
from pytest_distperf.perfmodel.links import Links
from pytest_distperf.perfmodel.predict import check_step, predict_step
from pytest_distperf.perfmodel.step import CHARGED_AS, StepInput, StepWork
from pytest_distperf.perfmodel.terms import DEFAULT_OVERHEADS, GB, Overheads

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.prediction import Prediction
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import Collectives, StrategyModel

# Backward is two matmuls per forward one (the input's and the weight's gradient): 2/3 of the
# forward+backward FLOPs, the window in which DDP's bucketed all-reduces can run.
BACKWARD_SHARE = 2 / 3
# AdamW (foreach) per parameter reads param, grad, exp_avg and exp_avg_sq and writes param,
# exp_avg and exp_avg_sq, all in the parameter's dtype: 7 x param_bytes moved.
ADAMW_ACCESSES = 7


def flops_split(shape: ModelShape, batch_size: int, seq_length: int) -> tuple[float, float]:
    """(blocks, head) model FLOPs of one training step: what tensor parallelism splits, and not."""
    tokens = batch_size * seq_length
    blocks = shape.n_layer * shape.block_param_count()
    attention = 12 * shape.n_layer * shape.n_head * shape.head_size * seq_length * tokens
    head = shape.padded_vocab_size * shape.n_embd
    return float(6 * blocks * tokens + attention), float(6 * head * tokens)


def model_flops_per_step(shape: ModelShape, batch_size: int, seq_length: int) -> float:
    """PaLM/Megatron "model FLOPs" of one data-parallel rank's training step, what MFU divides by:
    6 x parameters (not the embedding lookup) x tokens, plus the attention matmuls not halved for
    the causal mask (as PaLM counts them); no recomputation, no optimizer."""
    blocks, head = flops_split(shape, batch_size, seq_length)
    return blocks + head


def adamw_bytes(shape: ModelShape, param_bytes: int) -> float:
    """Bytes AdamW moves to update every parameter once."""
    params = shape.n_layer * shape.block_param_count() + shape.non_block_param_count()
    return float(ADAMW_ACCESSES * params * param_bytes)


def _train_work(
    x: StepInput, step_compute_s: float | None, matmul_flops_per_s: float | None
) -> StepWork:
    """The whole model's step on one rank: measured, or model FLOPs at the matmul rate."""
    first = "terms in seconds per training step"
    if step_compute_s is not None:
        note = (
            f"compute: measured single-process training step {step_compute_s * 1e3:.4g} ms "
            "(forward, backward, AdamW of the whole model; no overlap assumed inside it)"
        )
        return StepWork({"compute": step_compute_s}, {}, (first, note))
    assert matmul_flops_per_s is not None  # predict_train checked
    flops = model_flops_per_step(x.shape, x.batch_size, x.seq_length)
    terms = {"compute": flops / matmul_flops_per_s}
    notes = [
        first,
        f"compute: {flops / 1e12:.4g} model TFLOPs per step at {matmul_flops_per_s / 1e12:.4g} "
        "TFLOP/s (every matmul at the measured dense rate: no kernel, norm or softmax overhead, "
        "which errs fast)",
    ]
    bandwidth = x.links.memory_bandwidth
    moved = adamw_bytes(x.shape, x.param_bytes)
    if bandwidth:
        terms["optimizer"] = moved / bandwidth
        notes.append(f"optimizer: AdamW moves {moved / GB:.3g} GB at {bandwidth / GB:.4g} GB/s")
    else:
        notes.append("optimizer: not counted (no memory bandwidth known)")
    return StepWork(terms, {}, tuple(notes))


def predict_train(
    shape: ModelShape,
    record: StrategyModel,
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
    seconds per step, `counted_collectives` per step."""
    if record.train_refusal:
        raise ValueError(f"strategy {record.name!r} cannot train: {record.train_refusal}")
    if step_compute_s is None and matmul_flops_per_s is None:
        raise ValueError(
            f"strategy {record.name!r}: a training prediction needs step_compute_s (a measured "
            "single-process step) or matmul_flops_per_s (a measured matmul rate); got neither"
        )
    counts = {"batch_size": batch_size, "seq_length": seq_length, "param_bytes": param_bytes}
    figures = {"step_compute_s": step_compute_s, "matmul_flops_per_s": matmul_flops_per_s}
    check_step(devices, counts | {"comm_bytes": comm_bytes}, figures)
    x = StepInput(shape, devices, device_type, batch_size, seq_length, param_bytes, comm_bytes,
                  links, overheads, training=True)  # fmt: skip
    work = _train_work(x, step_compute_s, matmul_flops_per_s)
    return predict_step(record, x, work, counted_collectives)


def train_message_sizes(
    shape: ModelShape,
    records: Iterable[StrategyModel],
    devices: int,
    param_bytes: int,
    comm_bytes: int,
    batch_size: int,
    seq_length: int,
) -> MessageSizes:
    """The collective sizes a training step really uses under `records` (those that can train):
    a latency probe and one call of each collective, under the figures that time it."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    sizes = {"all_gather": {LATENCY_PROBE_BYTES}, "all_reduce": {LATENCY_PROBE_BYTES}, "p2p": set()}
    # A step's collectives do not depend on the links they cross: none known here.
    links = Links("none", devices, 0.0, 0.0, None, False)
    for record in records:
        for device_type in sorted(record.runs_on) if not record.train_refusal else ():
            x = StepInput(shape, devices, device_type, batch_size, seq_length, param_bytes,
                          comm_bytes, links, DEFAULT_OVERHEADS, training=True)  # fmt: skip
            for c in record.cost(x).collectives:
                sizes[CHARGED_AS.get(c.kind, c.kind)].add(round(c.bytes / c.calls))
    return MessageSizes(*(tuple(sorted(sizes[op])) for op in ("all_gather", "all_reduce", "p2p")))
