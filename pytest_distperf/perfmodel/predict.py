"""Predicted tokens/sec of one strategy as a sum of named per-token terms, and the verdict text
built from a prediction. Pure; each term and its reasoning: docs/perfmodel.md.

The strategy's own terms come from its record (a `perfmodel.cost.StrategyModel`, passed in by
the caller), never from a branch on its name here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pytest_distperf.perfmodel.cost import StrategyInput
from pytest_distperf.perfmodel.counted import (
    Collectives,
    describe,
    expected_collectives,
    with_counted,
)
from pytest_distperf.perfmodel.network import NetworkCharge, network_charge
from pytest_distperf.perfmodel.terms import (
    DEFAULT_OVERHEADS,
    GB,
    HOST_PATH_TERMS,
    LINK_TERMS,
    MB,
    TERM_DESCRIPTIONS,
    TRAIN_TERM_DESCRIPTIONS,
    Overheads,
)

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.cost import StrategyCost, StrategyModel
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.shape import ModelShape


@dataclass(frozen=True)
class Prediction:
    """A predicted rate and its named terms.

    `mode` "generate": terms, bytes and collectives per token (a decode step). `mode` "train"
    (`perfmodel.train.predict_train`): terms, bytes and collectives per training STEP, whose
    time is `step_time_s`; `time_per_token_s` is that step over its `tokens_per_step` (every
    data-parallel replica's tokens), and `tokens_per_sec` those tokens over the step.
    """

    strategy: str
    devices: int
    tokens_per_sec: float
    time_per_token_s: float
    terms: dict[str, float]  # seconds per token, by name (TERM_DESCRIPTIONS)
    bound: str  # the largest term's name
    bytes_per_token: dict[str, float]
    link_class: str
    bandwidth_used: float  # bytes/s: bus bandwidth at the strategy's main message size
    assumptions: tuple[str, ...]
    implementation: str = ""
    measured_links: bool = False
    collectives_per_token: int = 0
    batch_size: int = 1  # rows decoded in each step: a step of time_per_token_s yields this many
    # kind -> (calls, bytes) per token: what the strategy's model expects, and what the ranks
    # counted (None: not counted); the terms charge the counted ones (perfmodel/counted.py).
    expected_collectives: dict[str, tuple[float, float]] = field(default_factory=dict)
    counted_collectives: dict[str, tuple[float, float]] | None = None
    mode: str = "generate"  # or "train": see the class docstring for the units
    step_time_s: float | None = None  # train: seconds per optimizer step
    tokens_per_step: int = 0  # train: tokens of one step over all data-parallel replicas
    # A job over several nodes: the share of the link terms the network between them sets.
    network: NetworkCharge | None = None

    @property
    def bound_description(self) -> str:
        words = TRAIN_TERM_DESCRIPTIONS if self.mode == "train" else TERM_DESCRIPTIONS
        text = words.get(self.bound, self.bound)
        if self.bound in LINK_TERMS:
            text += f" over {self.link_class}"
        return text

    def to_dict(self) -> dict[str, Any]:
        data = self._fields_dict()
        if self.network is not None:  # a single node's prediction is written as it always was
            data["network"] = self.network.to_dict()
        return data

    def _fields_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "devices": self.devices,
            "implementation": self.implementation,
            "tokens_per_sec": self.tokens_per_sec,
            "time_per_token_s": self.time_per_token_s,
            "terms": dict(self.terms),
            "bound": self.bound,
            "bound_description": self.bound_description,
            "bytes_per_token": dict(self.bytes_per_token),
            "collectives_per_token": self.collectives_per_token,
            "batch_size": self.batch_size,
            "expected_collectives": _collectives_json(self.expected_collectives),
            "counted_collectives": None
            if self.counted_collectives is None
            else _collectives_json(self.counted_collectives),
            "link_class": self.link_class,
            "bandwidth_used": self.bandwidth_used,
            "measured_links": self.measured_links,
            "assumptions": list(self.assumptions),
            "mode": self.mode,
            "step_time_s": self.step_time_s,
            "tokens_per_step": self.tokens_per_step,
        }


def _collectives_json(collectives: Collectives) -> dict[str, dict[str, float]]:
    return {kind: {"calls": c, "bytes": b} for kind, (c, b) in sorted(collectives.items())}


def _kv_bytes(config: ModelShape, batch: int, seq_length: int, dtype_bytes: int) -> float:
    # The static cache is read whole every step (attention over all positions, masked).
    per_layer = 2 * batch * config.n_query_groups * config.head_size * seq_length * dtype_bytes
    return float(config.n_layer * per_layer)


def _compute_terms(
    x: StrategyInput, compute_time_s: float | None
) -> tuple[dict[str, float], dict[str, float], tuple[str, ...]]:
    cfg = x.config
    weights = (cfg.n_layer * cfg.block_param_count() + cfg.padded_vocab_size * cfg.n_embd) * (
        x.dtype_bytes
    )  # the embedding is a lookup of a few rows; lm_head is read whole
    kv = _kv_bytes(cfg, x.batch_size, x.seq_length, x.dtype_bytes)
    moved = {"weights_read": float(weights), "kv_read": kv}
    if compute_time_s is not None:
        note = f"compute: measured single-rank {compute_time_s * 1e3:.4g} ms per token"
        return {"compute": compute_time_s}, moved, (note,)
    bw = x.links.memory_bandwidth
    if not bw:
        raise ValueError("no memory bandwidth known and no measured compute time given")
    launch = cfg.n_layer * x.overheads.launch_per_layer_s
    notes = (
        f"compute: roofline, {(weights + kv) / GB:.3g} GB per token at {bw / GB:.4g} GB/s "
        f"+ eager launch {x.overheads.launch_per_layer_s * 1e3:g} ms x {cfg.n_layer} layers "
        "(no single-rank measurement given)",
    )
    return {"weights": (weights + kv) / bw, "launch": launch}, moved, notes


def _hidden_by_overlap(terms: Mapping[str, float], overlap: float) -> float:
    """Seconds per token that the two paths hide behind each other.

    FSDP issues each unit's all-gather on its own stream and the host goes on issuing compute
    while it runs, so where the host is never made to wait for the device (this project's
    decode loop) a token costs about the longer of the two paths, not their sum. How much a
    machine really hides is `overlap`, measured in the ranks (`calibrate`).
    """
    host = sum(v for k, v in terms.items() if k in HOST_PATH_TERMS)
    transfer = sum(v for k, v in terms.items() if k not in HOST_PATH_TERMS)
    return overlap * min(host, transfer)


CPU_NO_OVERLAP = "CPU ranks: no overlap assumed (gloo's threads share the compute's cores)"


def counted_overlap(links_overlap: float, device_type: str) -> tuple[float, tuple[str, ...]]:
    """(the overlap a prediction counts on, a note). CPU ranks count none: their threads fill
    the cores, so the collectives' threads take time from the compute, and what a calibration
    saw hidden was one session's scheduling (docs/perfmodel.md, `overlap`)."""
    if device_type != "cpu":
        return links_overlap, ()
    return 0.0, (CPU_NO_OVERLAP,) if links_overlap > 0 else ()


def _check_arguments(
    devices: int,
    batch_size: int,
    prompt_length: int,
    max_new_tokens: int,
    dtype_bytes: int,
    compute_time_s: float | None,
) -> None:
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    for name, value in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if prompt_length < 0 or dtype_bytes < 1:
        raise ValueError(f"bad prompt_length={prompt_length} or dtype_bytes={dtype_bytes}")
    if compute_time_s is not None and not compute_time_s > 0:
        raise ValueError(f"compute_time_s must be > 0, got {compute_time_s}")


@dataclass
class _Sum:
    """The terms of one prediction as they are added up, with the bytes and the notes."""

    terms: dict[str, float]
    moved: dict[str, float]
    notes: tuple[str, ...]

    def add_cost(self, cost: StrategyCost, overheads: Overheads) -> None:
        """The strategy's own terms; a rank that does only a share of the compute scales it."""
        if overheads.note and "fsdp_overhead" in cost.terms:  # what the note's figures scale
            self.notes += (overheads.note,)
        if cost.compute_share != 1.0:
            self.moved["weights_read"] *= cost.compute_share  # a tp rank or a stage its share
            own = "compute" if "compute" in self.terms else "weights"
            self.terms[own] *= cost.compute_share
            self.notes += (
                f"{own} x {cost.compute_share:.3g}: one rank's share ({cost.implementation})",
            )
        self.terms.update(cost.terms)
        self.moved.update(cost.bytes_per_token)

    def add_prefill(self, prefill_s: float, step_s: float, share: float, tokens: int) -> None:
        """The rate counts the prefill's token: its excess over a step is spread over all."""
        extra = (prefill_s - step_s) * share / tokens
        if extra > 0:
            self.terms["prefill"] = extra
            self.notes += (
                f"prefill: measured {_ms(prefill_s)}, its excess over one step "
                f"spread over {tokens} tokens",
            )

    def add_overlap(self, measured: float, device_type: str) -> None:
        overlap, notes = counted_overlap(measured, device_type)
        self.notes += notes
        hidden = _hidden_by_overlap(self.terms, overlap)
        if hidden:
            self.terms["overlap"] = -hidden
            self.notes += (
                f"overlap: {overlap:.0%} of the shorter of host path and transfer path "
                f"hidden (measured), {_ms(hidden)} per token",
            )


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
) -> Prediction:
    """Predicted tokens/sec of one rank's stream under `strategy` (its record) on `devices`.

    `compute_time_s`: the measured single-rank time per token (docs/perfmodel.md, compute);
    without it the compute comes from the memory bandwidth in `links` (a roofline). On one
    device a strategy still pays its wrapper's own costs (FSDP's per-unit hooks), with no
    traffic. `prefill_time_s`: the measured single-rank prefill; the rate counts the prefill's
    token, so what the prefill costs beyond one step is spread over the generation's tokens.
    `counted_collectives`: kind -> (calls, bytes) per decode token counted in the run's ranks;
    where they differ from what the strategy's model expects, they are charged instead.
    """
    _check_arguments(
        devices, batch_size, prompt_length, max_new_tokens, dtype_bytes, compute_time_s
    )
    x = StrategyInput(
        config,
        devices,
        device_type,
        batch_size,
        prompt_length + max_new_tokens,
        dtype_bytes,
        links,
        overheads,
    )
    total = _Sum(*_compute_terms(x, compute_time_s))
    cost = strategy.cost(x)
    expected = expected_collectives(cost)
    if counted_collectives is not None:
        cost = with_counted(cost, counted_collectives, x)
    network = network_charge(
        links, cost, lambda other: _charged(strategy, replace(x, links=other), counted_collectives)
    )
    total.add_cost(cost, overheads)
    if prefill_time_s is not None and compute_time_s is not None:
        total.add_prefill(prefill_time_s, compute_time_s, cost.compute_share, max_new_tokens)
    if cost.overlappable:
        total.add_overlap(links.overlap, device_type)
    terms = total.terms
    seconds = sum(terms.values())
    return Prediction(
        strategy=strategy.name,
        devices=devices,
        # counted as the measured rate is: every batch row's token of a step
        tokens_per_sec=batch_size / seconds if seconds > 0 else math.inf,
        time_per_token_s=seconds,
        terms=terms,
        bound=max(terms, key=lambda k: terms[k]),
        bytes_per_token=total.moved,
        link_class=links.link_class,
        bandwidth_used=links.busbw_at(cost.message_op, cost.message_bytes),
        assumptions=total.notes + cost.assumptions + links.assumptions,
        implementation=cost.implementation,
        measured_links=links.measured,
        collectives_per_token=cost.collectives,
        batch_size=batch_size,
        expected_collectives=expected,
        counted_collectives=None if counted_collectives is None else dict(counted_collectives),
        network=network,
    )


def _charged(
    strategy: StrategyModel, x: StrategyInput, counted: Collectives | None
) -> StrategyCost:
    """The strategy's cost, with the collectives the ranks counted where they were counted."""
    cost = strategy.cost(x)
    return cost if counted is None else with_counted(cost, counted, x)


def predict_all(
    config: ModelShape,
    devices: int,
    links: Links,
    strategies: Iterable[StrategyModel],
    **kwargs: Any,
) -> list[Prediction]:
    """`predict` for each of `strategies` (records), in their order."""
    return [predict(config, strategy, devices, links, **kwargs) for strategy in strategies]


# --------------------------------------------------------------------------- verdict text


# Headroom under the worst healthy measured/predicted ratio, yet a run slowed by half still
# fails; the threshold is the coarse gate, small drops are the baselines' job. Why this figure:
# docs/perfmodel.md ("Threshold").
DEFAULT_EFFICIENCY = 0.7


def threshold(prediction: Prediction, efficiency: float) -> float:
    """The lowest tokens/sec a run may reach: `efficiency` x predicted, efficiency in (0, 1]."""
    if isinstance(efficiency, bool) or not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    return efficiency * prediction.tokens_per_sec


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _gbps(value: float) -> str:
    return f"{value / GB:.3g} GB/s"


def describe_prediction(prediction: Prediction) -> str:
    """One line: predicted rate, its bound, the link and the bytes moved."""
    p = prediction
    if p.mode == "train":
        return _describe_train(p)
    kind = "measured" if p.measured_links else "nominal"
    received = p.bytes_per_token.get("all_gather_received", 0.0)
    terms = ", ".join(f"{k} {_ms(v)}" for k, v in p.terms.items())
    step = "/token" if p.batch_size == 1 else f" per step of {p.batch_size} rows"
    return (
        f"predicted {p.tokens_per_sec:.3g} tok/s ({_ms(p.time_per_token_s)}{step}), bound by "
        f"{p.bound} ({p.bound_description}, {_ms(p.terms[p.bound])}); link {p.link_class} at "
        f"{kind} {_gbps(p.bandwidth_used)} bus bandwidth; {received / MB:.4g} MB received per "
        f"token per rank in {p.collectives_per_token} collectives; terms: {terms}"
        f"{_expected_and_counted(p)}{_network(p)}"
    )


def _describe_train(p: Prediction) -> str:
    """A training step: "predicted X tok/s (step Y ms: compute a ms, ...; bound: ...)"."""
    kind = "measured" if p.measured_links else "nominal"
    step = p.step_time_s if p.step_time_s is not None else p.time_per_token_s * p.tokens_per_step
    terms = ", ".join(f"{k} {_ms(v)}" for k, v in p.terms.items())
    return (
        f"predicted {p.tokens_per_sec:.3g} tok/s (step {_ms(step)}: {terms}; bound: {p.bound}, "
        f"{p.bound_description}); {p.tokens_per_step} tokens per step over all data-parallel "
        f"replicas; link {p.link_class} at {kind} {_gbps(p.bandwidth_used)} bus bandwidth; "
        f"{p.collectives_per_token} collectives per step{_expected_and_counted(p, 'step')}"
        f"{_network(p, 'step')}"
    )


def _network(p: Prediction, per: str = "token") -> str:
    """The network term of a job over several nodes (nothing on one node)."""
    return "" if p.network is None else f"; {p.network.describe(per)}"


def _expected_and_counted(p: Prediction, per: str = "token") -> str:
    """The collectives per token (step) the model expects beside those the ranks counted."""
    if p.counted_collectives is None:
        return ""
    expected = describe(p.expected_collectives) or "none"
    counted = describe(p.counted_collectives) or "none"
    return f"; collectives per {per}, predicted: {expected}; counted: {counted}"


def failure_message(
    prediction: Prediction, measured_tokens_per_sec: float, efficiency: float
) -> str:
    """Why a run below `threshold(prediction, efficiency)` failed, in terms a user can act on."""
    p = prediction
    limit = threshold(p, efficiency)
    ratio = measured_tokens_per_sec / p.tokens_per_sec if p.tokens_per_sec else 0.0
    impl = f" ({p.implementation})" if p.implementation else ""
    return (
        f"{p.strategy}{impl} on {p.devices} device(s): measured {measured_tokens_per_sec:.3g} "
        f"tok/s is below the threshold {limit:.3g} tok/s ({efficiency:.0%} of the modelled "
        f"{p.tokens_per_sec:.3g} tok/s); measured/predicted = {ratio:.2f}.\n"
        f"  {describe_prediction(p)}{_compute_source(p)}"
    )


def _compute_source(p: Prediction) -> str:
    """Where the predicted compute came from."""
    notes = [a for a in p.assumptions if a.startswith("compute")]
    if not notes:
        return ""
    return "\n  " + "\n  ".join(notes)
