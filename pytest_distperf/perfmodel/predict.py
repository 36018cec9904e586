"""Predicted tokens/sec as a sum of named terms of one step (`predict_step`, decode and training
alike) and a decode step's own inputs (`predict`); the strategy's share comes from its record,
never from a branch on its name. Each term and its reasoning: docs/perfmodel.md."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from pytest_distperf.perfmodel.calibration import LATENCY_PROBE_BYTES, MessageSizes, bus_factor
from pytest_distperf.perfmodel.prediction import NetworkCharge, Prediction
from pytest_distperf.perfmodel.shape import kv_cache_bytes
from pytest_distperf.perfmodel.step import (
    CHARGED_AS,
    Collectives,
    StepInput,
    StepWork,
    charged_collectives,
    expected_collectives,
)
from pytest_distperf.perfmodel.terms import (
    DEFAULT_OVERHEADS,
    GB,
    HOST_PATH_TERMS,
    LINK_TERMS,
    TRANSFER_PATH_TERMS,
    Overheads,
    ms,
)

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.shape import ModelShape
    from pytest_distperf.perfmodel.step import Collective, StepCost, StrategyModel


def predict_step(
    record: StrategyModel, x: StepInput, work: StepWork, counted: Collectives | None
) -> Prediction:
    """The single-rank `work` scaled by the rank's shares, plus the record's collectives (the
    `counted` ones where they differ) and overheads, less what overlaps."""
    cost = record.cost(x)
    per = "step" if x.training else "token"
    charged, counted_note = (
        (cost.collectives, ()) if counted is None else charged_collectives(cost, counted, per)
    )
    terms, moved, notes = dict(work.terms), dict(work.moved), work.notes
    if cost.compute_share != 1.0:
        if "weights_read" in moved:  # a tp rank streams its share of the weights
            moved["weights_read"] *= cost.compute_share
        own = "compute" if "compute" in terms else "weights"
        terms[own] *= cost.compute_share
        notes += (f"{own} x {cost.compute_share:.3g}: one rank's share ({cost.implementation})",)
    if "optimizer" in terms and cost.optimizer_share != 1.0:
        terms["optimizer"] *= cost.optimizer_share
        notes += (f"optimizer x {cost.optimizer_share:.3g}: this rank's parameters",)
    if x.overheads.note and cost.units:  # what the note's figures scale
        notes += (x.overheads.note,)
    terms.update(collective_terms(charged, x.links, x.devices))
    moved |= cost.moved | _moved_bytes(charged, x.devices)
    terms.update(_host_work(cost, x, moved))
    if work.prefill is not None:
        prefill_s, step_s, tokens = work.prefill
        extra = (prefill_s - step_s) * cost.compute_share / tokens
        if extra > 0:  # the rate counts the prefill's token: its excess is spread over all
            terms["prefill"] = extra
            notes += (
                f"prefill: measured {ms(prefill_s)}, its excess over one step "
                f"spread over {tokens} tokens",
            )
    if x.training and x.devices == 1:  # nothing crosses a link
        terms = {k: v for k, v in terms.items() if k not in LINK_TERMS or v}
    if cost.hidden_behind > 0:
        notes += _add_overlap(terms, cost, x)
    seconds = sum(terms.values())
    tokens = record.replicas(x.devices) * x.batch_size * x.seq_length if x.training else 0
    rows = tokens or x.batch_size  # a decode step yields a token for every batch row
    return Prediction(
        strategy=record.name,
        devices=x.devices,
        tokens_per_sec=rows / seconds if seconds > 0 else math.inf,
        time_per_token_s=seconds / tokens if tokens else seconds,
        terms=terms,
        bound=max(terms, key=lambda k: terms[k]),
        bytes_per_token=moved,
        link_class=x.links.link_class,
        bandwidth_used=x.links.busbw_at(*cost.message),
        assumptions=notes + counted_note + cost.assumptions + x.links.assumptions,
        implementation=cost.implementation,
        measured_links=x.links.measured,
        collectives_per_token=int(sum(c.calls for c in charged)),
        batch_size=x.batch_size,
        expected_collectives=expected_collectives(cost),
        counted_collectives=None if counted is None else dict(counted),
        mode="train" if x.training else "generate",
        step_time_s=seconds if x.training else None,
        tokens_per_step=tokens,
        network=_network_charge(x, terms, charged),
    )


def _network_charge(
    x: StepInput, terms: dict[str, float], charged: tuple[Collective, ...]
) -> NetworkCharge | None:
    """Each link term less the same collectives' with the network's calls free; None on one node."""
    if x.links.nodes <= 1:
        return None
    free = collective_terms(charged, replace(x.links, network_free=True), x.devices)
    shares = {k: v - free.get(k, 0.0) for k, v in terms.items() if k in LINK_TERMS}
    positive = {k: v for k, v in shares.items() if v > 0}
    return NetworkCharge(
        x.links.nodes, positive, x.links.busbw, x.links.latency_s, x.links.measured
    )


def _priced(c: Collective, links: Links, devices: int) -> tuple[float, float]:
    """(transfer, latency) seconds of one call of `c` among `devices` ranks."""
    if c.kind == "p2p":
        return links.hop_time(c.bytes / c.calls, c.across_nodes) if devices > 1 else (0.0, 0.0)
    return links.collective_time(CHARGED_AS[c.kind], c.bytes / c.calls, devices)


def collective_terms(
    collectives: Iterable[Collective], links: Links, devices: int
) -> dict[str, float]:
    """Each charged term's transfer seconds, then `latency`: every call's."""
    terms: dict[str, float] = {}
    latency = 0.0
    for c in collectives:
        transfer, call_latency = _priced(c, links, devices)
        terms[c.charged_to] = terms.get(c.charged_to, 0.0) + c.calls * transfer
        latency += c.calls * call_latency
    return {**terms, "latency": latency} if terms else {}


def _host_work(cost: StepCost, x: StepInput, moved: dict[str, float]) -> dict[str, float]:
    """The wrapper's per-unit host work, and its copies around every gather and reduction: of S
    bytes, 2S, S and S/n (FSDP2)."""
    terms = {}
    reshaped = [c for c in cost.collectives if c.kind in ("all_gather", "reduce_scatter")]
    if cost.units:
        calls = sum(c.calls for c in reshaped)
        terms["fsdp_overhead"] = x.passes * cost.units * cost.unit_s + calls * cost.collective_s
    copied = 2 * sum(c.bytes for c in reshaped) * (1 + 1 / x.devices)
    if cost.copies and copied:
        bandwidth = x.links.copy_bandwidth or x.links.memory_bandwidth
        terms["gather_copies"] = copied / bandwidth if bandwidth else 0.0
        moved["gather_copies"] = copied
    return terms


def _moved_bytes(collectives: Iterable[Collective], devices: int) -> dict[str, float]:
    """Bytes of each kind in nccl-tests' sizes, and what a rank receives of the all-gathers."""
    by_kind: dict[str, float] = {}
    for c in collectives:
        by_kind[c.kind] = by_kind.get(c.kind, 0.0) + c.bytes
    moved = {}
    for kind, nbytes in by_kind.items():
        if kind == "all_gather":
            received = nbytes * bus_factor("all_gather", devices) if devices > 1 else 0.0
            moved |= {"all_gather_output": nbytes, "all_gather_received": received}
        else:
            moved[f"{kind}_bytes"] = nbytes
    return moved


def _add_overlap(terms: dict[str, float], cost: StepCost, x: StepInput) -> tuple[str, ...]:
    """The transfers hidden behind the host's work, as the negative term `overlap`: collectives
    run on their own stream, so the measured share of the shorter path is hidden; the transfers
    nothing runs beside stay whole."""
    overlap, notes = x.links.overlap, ()
    if x.device_type == "cpu":
        cpu = "CPU ranks: no overlap assumed (gloo's threads share the compute's cores)"
        overlap, notes = 0.0, (cpu,) if overlap > 0 else ()
    host = cost.hidden_behind * sum(v for k, v in terms.items() if k in HOST_PATH_TERMS)
    transfer = sum(v for k, v in terms.items() if k in TRANSFER_PATH_TERMS)
    fixed = [c for c in cost.collectives if not c.overlappable]
    exposed = sum(c.calls * sum(_priced(c, x.links, x.devices)) for c in fixed)
    hidden = overlap * min(host, max(0.0, transfer - exposed))
    if not hidden:
        return notes
    terms["overlap"] = -hidden
    if not x.training:
        return (
            *notes,
            f"overlap: {overlap:.0%} of the shorter of host path and transfer path hidden "
            f"(measured), {ms(hidden)} per token",
        )
    return (
        *notes,
        f"overlap: {overlap:.0%} (measured) of the transfers, less the {exposed * 1e3:.3g} ms "
        f"nothing can hide (the first gather, the last reduction), hidden behind "
        f"{cost.hidden_behind:.2g} of the compute: {hidden * 1e3:.3g} ms per step",
    )


def check_step(
    devices: int, counts: Mapping[str, int], figures: Mapping[str, float | None]
) -> None:
    """`counts` positive ints, `figures` (where given) positive and finite."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    for name, figure in figures.items():
        if figure is not None and not 0 < figure < math.inf:
            raise ValueError(f"{name} must be > 0 and finite, got {figure!r}")


def _decode_work(x: StepInput, compute_time_s: float | None) -> StepWork:
    """One decode step's compute on one rank: measured, or a roofline from memory bandwidth."""
    cfg = x.shape
    # The embedding is a lookup of a few rows; lm_head is read whole.
    weights = (cfg.n_layer * cfg.block_param_count() + cfg.padded_vocab_size * cfg.n_embd) * (
        x.comm_bytes
    )
    kv = kv_cache_bytes(cfg, x.batch_size, x.seq_length, x.comm_bytes)
    moved = {"weights_read": float(weights), "kv_read": kv}
    if compute_time_s is not None:
        note = f"compute: measured single-rank {compute_time_s * 1e3:.4g} ms per token"
        return StepWork({"compute": compute_time_s}, moved, (note,))
    bw = x.links.memory_bandwidth
    if not bw:
        raise ValueError("no memory bandwidth known and no measured compute time given")
    launch = cfg.n_layer * x.overheads.launch_per_layer_s
    notes = (
        f"compute: roofline, {(weights + kv) / GB:.3g} GB per token at {bw / GB:.4g} GB/s "
        f"+ eager launch {x.overheads.launch_per_layer_s * 1e3:g} ms x {cfg.n_layer} layers "
        "(no single-rank measurement given)",
    )
    return StepWork({"weights": (weights + kv) / bw, "launch": launch}, moved, notes)


def predict(
    config: ModelShape,
    strategy: StrategyModel,
    devices: int,
    links: Links,
    *,
    device_type: str = "cuda",
    batch_size: int = 1,
    prompt_length: int = 8,
    max_new_tokens: int = 50,
    dtype_bytes: int = 2,
    compute_time_s: float | None = None,
    overheads: Overheads = DEFAULT_OVERHEADS,
    prefill_time_s: float | None = None,
    counted_collectives: Collectives | None = None,
    collective_in_step_s: float | None = None,
) -> Prediction:
    """Predicted tokens/sec of one rank's decode stream under `strategy` (its record).

    `compute_time_s`: the measured single-rank time per token, else a roofline from `links`'
    memory bandwidth; `prefill_time_s`: the measured single-rank prefill; `counted_collectives`:
    kind -> (calls, bytes) per token counted in the ranks; `collective_in_step_s`: one collective
    timed between the whole model's layers, the least each call costs.
    """
    counts = {"batch_size": batch_size, "max_new_tokens": max_new_tokens}
    check_step(devices, counts | {"dtype_bytes": dtype_bytes}, {"compute_time_s": compute_time_s})
    if prompt_length < 0:
        raise ValueError(f"prompt_length must be >= 0, got {prompt_length}")
    if collective_in_step_s:
        links = links.in_step(collective_in_step_s)
    x = StepInput(config, devices, device_type, batch_size, prompt_length + max_new_tokens,
                  dtype_bytes, dtype_bytes, links, overheads)  # fmt: skip
    work = _decode_work(x, compute_time_s)
    if prefill_time_s is not None and compute_time_s is not None:
        work = replace(work, prefill=(prefill_time_s, compute_time_s, max_new_tokens))
    return predict_step(strategy, x, work, counted_collectives)


def message_sizes(
    config: ModelShape,
    strategies: Iterable[StrategyModel],
    devices: int,
    dtype_bytes: int,
    batch: int = 1,
) -> MessageSizes:
    """The message sizes the model really uses under `strategies`: a latency probe, the per-token
    activation (a tensor-parallel all-reduce), and what each record asks for."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    activation = batch * config.n_embd * dtype_bytes
    gather = {LATENCY_PROBE_BYTES, activation}
    reduce = {LATENCY_PROBE_BYTES, activation}
    p2p: set[int] = set()
    for strategy in strategies:
        own = strategy.message_sizes(config, dtype_bytes, batch)
        gather.update(own.all_gather)
        reduce.update(own.all_reduce)
        p2p.update(own.p2p)
    return MessageSizes(tuple(sorted(gather)), tuple(sorted(reduce)), tuple(sorted(p2p)))
