"""The vocabulary of a prediction: term names, fixed overheads, and what a strategy's cost
function receives (`StrategyInput`) and returns (`StrategyCost`). Pure values; docs/perfmodel.md
explains each term."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_distperf.perfmodel.links import Links
    from pytest_distperf.perfmodel.shape import ModelShape

GB = 1e9
MB = 1e6

# What each term means, for messages and the CLI; keys are the `Prediction.terms` names.
TERM_DESCRIPTIONS = {
    "compute": "single-rank compute (measured)",
    "prefill": "the prefill's cost beyond one decode step, per token (measured)",
    "weights": "weights and KV streaming from memory",
    "launch": "eager per-layer launch overhead",
    "all_gather": "all-gather traffic",
    "all_reduce": "tensor-parallel activation all-reduces (2 per block)",
    "p2p": "pipeline point-to-point hops (activations on, the token back)",
    "latency": "per-collective latency",
    "fsdp_overhead": "FSDP per-unit overhead",
    "gather_copies": "FSDP2 copy-in/copy-out of gathered weights",
    "overlap": "transfer and host work hidden behind each other (negative)",
}

# Work that the host issues in order on the compute stream; everything else (all-gathers, their
# latency, FSDP2's copies around them) runs on the collective's own stream.
HOST_PATH_TERMS = frozenset({"compute", "prefill", "weights", "launch", "fsdp_overhead"})
# Terms that a link's bandwidth or latency sets: a message names the link beside them.
LINK_TERMS = frozenset({"all_gather", "all_reduce", "p2p", "latency"})


@dataclass(frozen=True)
class Overheads:
    """Fixed per-forward costs that no bandwidth explains, in seconds.

    Fitted once on 2 x H200 rows (eager) and used for every model and link; the fits and their
    sources are in docs/perfmodel.md ("Fixed overheads"). They are host-CPU costs, so a slow
    host pays more, which its measured compute and calibrated collectives dominate anyway.
    """

    # Eager decode launches tens of kernels per layer, on top of the weights streaming.
    launch_per_layer_s: float = 0.28e-3
    # FSDP1 FULL_SHARD, per unit: hooks and parameter views, paid even when nothing is gathered.
    fsdp1_unit_s: float = 0.95e-3
    # FSDP2, per unit that does not gather (reshard_after_forward=False).
    fsdp2_unit_s: float = 0.3e-3
    # FSDP2, per unit that gathers, on top of `fsdp2_unit_s` and of `gather_copies`.
    fsdp2_gather_s: float = 0.6e-3
    # Compiled with graph breaks at the wrapper's hooks: each unit also leaves and re-enters
    # the compiled code (guards, resume), so its host work costs this many times the eager one.
    graph_break_unit_factor: float = 1.35
    note: str = ""  # said in the prediction's assumptions when these are not the eager figures

    def around_graph_breaks(self) -> Overheads:
        """The per-unit costs of a run compiled around its wrapper's hooks (docs/perfmodel.md)."""
        if self.note:  # already scaled
            return self
        k = self.graph_break_unit_factor
        return replace(
            self,
            fsdp1_unit_s=self.fsdp1_unit_s * k,
            fsdp2_unit_s=self.fsdp2_unit_s * k,
            fsdp2_gather_s=self.fsdp2_gather_s * k,
            note=f"per-unit wrapper costs x {k:g}: compiled with graph breaks at its hooks",
        )


DEFAULT_OVERHEADS = Overheads()


@dataclass(frozen=True)
class StrategyInput:
    """Everything a strategy's cost function may look at."""

    config: ModelShape
    devices: int
    device_type: str  # "cuda" or "cpu": a strategy may be built differently on each
    batch_size: int
    seq_length: int  # prompt + new tokens: the static KV cache's length
    dtype_bytes: int
    links: Links
    overheads: Overheads


@dataclass(frozen=True)
class StrategyCost:
    """A strategy's own per-token terms, on top of the compute terms every strategy pays."""

    implementation: str
    terms: dict[str, float]
    bytes_per_token: dict[str, float]
    collectives: int  # per token
    message_bytes: float  # the dominant message size, for the bandwidth that is reported
    assumptions: tuple[str, ...] = ()
    # Share of the single-rank compute each rank still does per token (tensor parallel: its
    # shard of the weights); scales the measured `compute` or the roofline's `weights`.
    compute_share: float = 1.0
    # False when every transfer's result is the next operation's input (tensor-parallel
    # all-reduces, pipeline hops): nothing hides behind it, whatever the calibrated overlap.
    overlappable: bool = True
    message_op: str = "all_gather"  # the collective of `message_bytes` ("all_reduce", "p2p")
