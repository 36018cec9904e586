"""The vocabulary of a prediction: units, term names and the fixed overheads no bandwidth
explains. Pure values; docs/perfmodel.md explains each term. What a strategy's cost function
receives and returns is in `perfmodel.step`."""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9
MB = 1e6


def ms(seconds: float) -> str:
    """E.g. "3.1 ms": how messages write seconds."""
    return f"{seconds * 1e3:.3g} ms"


# What each term means, for messages and the CLI; keys are the `Prediction.terms` names.
TERM_DESCRIPTIONS = {
    "compute": "single-rank compute (measured)",
    "prefill": "the prefill's cost beyond one decode step, per token (measured)",
    "weights": "weights and KV streaming from memory",
    "launch": "eager per-layer launch overhead",
    "all_gather": "all-gather traffic",
    "all_reduce": "all-reduce traffic (tensor parallel: 2 activation all-reduces per block)",
    "reduce_scatter": "reduce-scatter traffic (counted in the ranks)",
    "p2p": "pipeline point-to-point hops (activations on, the token back)",
    "latency": "per-collective latency",
    "fsdp_overhead": "FSDP per-unit overhead",
    "gather_copies": "FSDP2 copy-in/copy-out of gathered weights",
    "overlap": "transfer and host work hidden behind each other (negative)",
    "grad_all_reduce": "DDP's gradient all-reduce, bucket by bucket",
    "optimizer": "AdamW's update streaming parameters, gradients and states from memory",
}
# A training step's terms (seconds per step, perfmodel/train.py) where they mean more than above.
TRAIN_TERM_DESCRIPTIONS = {
    **TERM_DESCRIPTIONS,
    "compute": "single-process training step (forward, backward, AdamW; measured or model "
    "FLOPs at the matmul rate)",
    "all_gather": "FSDP all-gathers (forward, and backward where resharded)",
    "all_reduce": "tensor parallel activation all-reduces (2 per block forward, 2 backward)",
    "reduce_scatter": "reduce-scatter of each unit's gradients",
    "fsdp_overhead": "FSDP per-unit overhead (forward and backward)",
    "gather_copies": "FSDP2 copies into and out of the gathers' and reductions' buffers",
}

# Work that the host issues in order on the compute stream; everything else (all-gathers, their
# latency, FSDP2's copies around them) runs on the collective's own stream.
HOST_PATH_TERMS = frozenset({"compute", "prefill", "weights", "launch", "fsdp_overhead"})
# Terms that a link's bandwidth or latency sets: a message names the link beside them.
LINK_TERMS = frozenset(
    {"all_gather", "all_reduce", "reduce_scatter", "grad_all_reduce", "p2p", "latency"}
)
# The collectives' side: what may hide behind the host's path (an optimizer runs on neither: it
# waits for the last reduction).
TRANSFER_PATH_TERMS = LINK_TERMS | {"gather_copies"}


# Fitted once on the 2 x H200 eager rows; each fit and its rows: docs/perfmodel.md ("Fixed
# overheads"), refitted with the overlap out in docs/benchmarks/h200-2026-11-29-overlap.md.
LAUNCH_PER_LAYER_S = 0.28e-3  # the eager pythia-2.8b and llama-2-7b reference rows
FSDP1_UNIT_S = 0.95e-3  # (measured - compute - gathers) / units, FSDP1 FULL_SHARD rows
FSDP2_UNIT_S = 0.3e-3  # FSDP2 rows with reshard_after_forward=False
FSDP2_GATHER_S = 0.6e-3  # FSDP2 resharding rows, beyond FSDP2_UNIT_S and the gather copies
# The 8 compiled FSDP rows of docs/benchmarks/h200-2026-12-01-gate3.md, checked in gate4.md.
GRAPH_BREAK_UNIT_FACTOR = 1.35


@dataclass(frozen=True)
class Overheads:
    """Fixed per-forward costs that no bandwidth explains, in seconds.

    Used for every model and link. They are host-CPU costs, so a slow host pays more, which its
    measured compute and calibrated collectives dominate anyway.
    """

    # Eager decode launches tens of kernels per layer, on top of the weights streaming.
    launch_per_layer_s: float = LAUNCH_PER_LAYER_S
    # FSDP1 FULL_SHARD, per unit: hooks and parameter views, paid even when nothing is gathered.
    fsdp1_unit_s: float = FSDP1_UNIT_S
    # FSDP2, per unit that does not gather (reshard_after_forward=False).
    fsdp2_unit_s: float = FSDP2_UNIT_S
    # FSDP2, per unit that gathers, on top of `fsdp2_unit_s` and of `gather_copies`.
    fsdp2_gather_s: float = FSDP2_GATHER_S
    # Compiled with graph breaks at the wrapper's hooks: each unit also leaves and re-enters
    # the compiled code (guards, resume), so its host work costs this many times the eager one.
    graph_break_unit_factor: float = GRAPH_BREAK_UNIT_FACTOR
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
