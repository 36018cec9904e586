"""A prediction's vocabulary: units, term names and the fixed overheads no bandwidth explains
(docs/perfmodel.md explains each term)."""

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


@dataclass(frozen=True)
class Overheads:
    """Fixed per-forward host costs in seconds, for every model and link; fitted once on the
    2 x H200 eager rows (docs/perfmodel.md, "Fixed overheads"; refitted with the overlap out in
    docs/benchmarks/h200-2026-11-29-overlap.md)."""

    # Eager decode launches tens of kernels per layer (the pythia-2.8b and llama-2-7b rows).
    launch_per_layer_s: float = 0.28e-3
    # FSDP1 FULL_SHARD, per unit: hooks and parameter views, paid even when nothing is gathered.
    fsdp1_unit_s: float = 0.95e-3
    # FSDP2, per unit that does not gather (the reshard_after_forward=False rows).
    fsdp2_unit_s: float = 0.3e-3
    # FSDP2, per unit that gathers, on top of `fsdp2_unit_s` and of `gather_copies`.
    fsdp2_gather_s: float = 0.6e-3
    # Compiled with graph breaks at the wrapper's hooks, each unit's host work costs this many
    # times the eager one (docs/benchmarks/h200-2026-12-01-gate3.md, checked in gate4.md).
    graph_break_unit_factor: float = 1.35
    note: str = ""  # said in the prediction's assumptions when these are not the eager figures

    def around_graph_breaks(self) -> Overheads:
        """The per-unit costs of a run compiled around its wrapper's hooks."""
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
