"""The phases of the bare model (ranks/bare.py) around wrapping: its whole copy taken before
wrapping, the copy or the model's own module once wrapped, and a replicated model's reference
timed after the repeats (ranks/reference.py)."""

from __future__ import annotations

from pytest_distperf.ranks.bare import BareCopy
from pytest_distperf.ranks.context import RankContext
from pytest_distperf.ranks.reference import generations_after, tokens_after


def copy_whole(ctx: RankContext) -> None:
    """A sharded model's bare copy, copied whole before wrapping shards it where its memory
    cannot run out mid-run (an RSS heap): cheaper than building it again from the seed."""
    if ctx.copies_whole:
        ctx.bare = BareCopy.copied(ctx.model, ctx.workload, ctx.prompt, ctx.dtype, ctx.generate)


def bare_copy(ctx: RankContext) -> None:
    """The bare model once wrapped: beside every wrapped generation where the relative speed is
    measured (a sharded model's whole copy built again from the seed, unless copied before
    wrapping); a replicated model's own module, timed after the repeats, elsewhere."""
    workload = ctx.workload
    if ctx.bare is not None:  # copied before wrapping
        return
    if ctx.record.sharded:
        beside = ctx.bare_beside
        ctx.bare = (
            BareCopy.whole(workload, ctx.prompt, ctx.dtype, ctx.generate)
            if beside
            else BareCopy(None, ctx.prompt, workload.max_new_tokens)
        )
        return
    module = ctx.model.module if ctx.spec.reference_steps else None
    ctx.bare = BareCopy(module, ctx.prompt, workload.max_new_tokens, ctx.generate)


def reference_after(ctx: RankContext) -> None:
    """A replicated model's reference where no bare generation ran beside the repeats: its own
    module, warm, timed alone after them (ranks/reference.py)."""
    workload = ctx.workload
    count = generations_after(
        ctx.record.sharded, ctx.bare_beside, workload.max_new_tokens, ctx.spec.reference_steps
    )
    tokens = tokens_after(
        workload.max_new_tokens, ctx.spec.reference_steps, ctx.generate is not None
    )
    timed = (ctx.bare.generation(tokens) for _ in range(count))
    ctx.after_samples = [sample for sample in timed if sample is not None]
    ctx.after_tokens = tokens
