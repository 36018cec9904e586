"""A prediction (a rate and its named terms) and the verdict text built from it: the threshold,
the one-line description, the failure message."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pytest_distperf.perfmodel.step import Collectives, describe
from pytest_distperf.perfmodel.terms import (
    GB,
    LINK_TERMS,
    MB,
    TERM_DESCRIPTIONS,
    TRAIN_TERM_DESCRIPTIONS,
    ms,
)

# Headroom under the worst healthy measured/predicted ratio, yet a run slowed by half still
# fails; small drops are the baselines' job. Why this figure: docs/perfmodel.md ("Threshold").
DEFAULT_EFFICIENCY = 0.7


@dataclass(frozen=True)
class NetworkCharge:
    """For each link term, the seconds of it that crossing nodes costs (per token or step)."""

    nodes: int
    terms: dict[str, float]
    busbw: float  # bytes/s of the network's figures at large messages
    latency_s: float
    measured: bool

    @property
    def seconds(self) -> float:
        return sum(self.terms.values())

    def describe(self, per: str = "token") -> str:
        """E.g. "network term: 3.1 ms per token (all_gather 2.9 ms, ...) crosses the network
        between 2 nodes at its measured 0.31 GB/s bus bandwidth, 250 us latency"."""
        kind = "measured" if self.measured else "nominal"
        latency = f"{self.latency_s * 1e6:.3g} us"
        figures = f"{kind} {self.busbw / GB:.3g} GB/s bus bandwidth, {latency} latency"
        where = f"network between {self.nodes} nodes"
        if not self.terms:
            return f"network term: none (nothing crosses the {where}; its {figures})"
        parts = ", ".join(f"{k} {ms(v)}" for k, v in self.terms.items())
        return (
            f"network term: {ms(self.seconds)} per {per} ({parts}) crosses the {where} at its "
            f"{figures}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": self.seconds}


@dataclass(frozen=True)
class Prediction:
    """A predicted rate and its named terms: per token (`mode` "generate"), or per training step
    ("train") of `step_time_s` over `tokens_per_step` (every data-parallel replica's tokens)."""

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
    # counted (None: not counted); the terms charge the counted ones (perfmodel/step.py).
    expected_collectives: dict[str, tuple[float, float]] = field(default_factory=dict)
    counted_collectives: dict[str, tuple[float, float]] | None = None
    mode: str = "generate"  # or "train"
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
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "network"}
        counted = self.counted_collectives
        data |= {
            "terms": dict(self.terms),
            "bound_description": self.bound_description,
            "bytes_per_token": dict(self.bytes_per_token),
            "expected_collectives": _collectives_json(self.expected_collectives),
            "counted_collectives": None if counted is None else _collectives_json(counted),
            "assumptions": list(self.assumptions),
        }
        if self.network is not None:  # a single node's prediction is written as it always was
            data["network"] = self.network.to_dict()
        return data


def _collectives_json(collectives: Collectives) -> dict[str, dict[str, float]]:
    return {kind: {"calls": c, "bytes": b} for kind, (c, b) in sorted(collectives.items())}


def threshold(prediction: Prediction, efficiency: float) -> float:
    """The lowest tokens/sec a run may reach: `efficiency` x predicted, efficiency in (0, 1]."""
    if isinstance(efficiency, bool) or not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency!r}")
    return efficiency * prediction.tokens_per_sec


def describe_prediction(prediction: Prediction) -> str:
    """One line: predicted rate, its bound, the link and the bytes moved (training: the step)."""
    p = prediction
    per = "step" if p.mode == "train" else "token"
    terms = ", ".join(f"{k} {ms(v)}" for k, v in p.terms.items())
    kind = "measured" if p.measured_links else "nominal"
    link = f"link {p.link_class} at {kind} {p.bandwidth_used / GB:.3g} GB/s bus bandwidth"
    tail = "" if p.network is None else f"; {p.network.describe(per)}"
    if p.counted_collectives is not None:  # the model's collectives beside the ranks' count
        expected = describe(p.expected_collectives) or "none"
        counted = describe(p.counted_collectives) or "none"
        tail = f"; collectives per {per}, predicted: {expected}; counted: {counted}{tail}"
    if p.mode == "train":
        step = p.time_per_token_s * p.tokens_per_step if p.step_time_s is None else p.step_time_s
        return (
            f"predicted {p.tokens_per_sec:.3g} tok/s (step {ms(step)}: {terms}; bound: {p.bound}, "
            f"{p.bound_description}); {p.tokens_per_step} tokens per step over all data-parallel "
            f"replicas; {link}; {p.collectives_per_token} collectives per step{tail}"
        )
    received = p.bytes_per_token.get("all_gather_received", 0.0)
    rows = "/token" if p.batch_size == 1 else f" per step of {p.batch_size} rows"
    return (
        f"predicted {p.tokens_per_sec:.3g} tok/s ({ms(p.time_per_token_s)}{rows}), bound by "
        f"{p.bound} ({p.bound_description}, {ms(p.terms[p.bound])}); {link}; "
        f"{received / MB:.4g} MB received per token per rank in {p.collectives_per_token} "
        f"collectives; terms: {terms}{tail}"
    )


def failure_message(
    prediction: Prediction, measured_tokens_per_sec: float, efficiency: float
) -> str:
    """Why a run below `threshold(prediction, efficiency)` failed, in terms a user can act on;
    where the predicted compute came from closes it."""
    p = prediction
    limit = threshold(p, efficiency)
    ratio = measured_tokens_per_sec / p.tokens_per_sec if p.tokens_per_sec else 0.0
    impl = f" ({p.implementation})" if p.implementation else ""
    compute = "".join(f"\n  {a}" for a in p.assumptions if a.startswith("compute"))
    return (
        f"{p.strategy}{impl} on {p.devices} device(s): measured {measured_tokens_per_sec:.3g} "
        f"tok/s is below the threshold {limit:.3g} tok/s ({efficiency:.0%} of the modelled "
        f"{p.tokens_per_sec:.3g} tok/s); measured/predicted = {ratio:.2f}.\n"
        f"  {describe_prediction(p)}{compute}"
    )
