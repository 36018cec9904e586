"""The bare model's phases (ranks/bare.py) around wrapping, and a replicated model's reference
timed after the repeats (ranks/reference.py)."""

from __future__ import annotations

from pytest_distperf.ranks.bare import BareCopy
from pytest_distperf.ranks.context import RankContext
from pytest_distperf.ranks.reference import generations_after, tokens_after


def copy_whole(ctx: RankContext) -> None:
    """A sharded model's bare copy taken before wrapping where memory is an RSS heap: cheaper
    than building it again from the seed."""
    if ctx.copies_whole:
        args = (ctx.workload, ctx.prompt, ctx.dtype, ctx.generate, ctx.spec.test_dir)
        ctx.bare = BareCopy.copied(ctx.model, *args)


def bare_copy(ctx: RankContext) -> None:
    """The bare model once wrapped: a sharded model's whole copy beside every repeat where the
    relative speed is measured (unless copied before wrapping); a replicated model's own
    module, which is the same object."""
    workload, sharded = ctx.workload, ctx.record.sharded
    if ctx.bare is not None:
        return
    if sharded and ctx.bare_beside:
        ctx.bare = BareCopy.whole(workload, ctx.prompt, ctx.dtype, ctx.generate, ctx.spec.test_dir)
        return
    module = ctx.model.module if ctx.spec.reference_steps and not sharded else None
    ctx.bare = BareCopy(module, ctx.prompt, workload.max_new_tokens, ctx.generate)


def reference_after(ctx: RankContext) -> None:
    """A replicated model's reference where no bare generation ran beside the repeats: its own
    module, warm, timed alone after them."""
    workload, steps = ctx.workload, ctx.spec.reference_steps
    count = generations_after(ctx.record.sharded, ctx.bare_beside, workload.max_new_tokens, steps)
    tokens = tokens_after(workload.max_new_tokens, steps, ctx.generate is not None)
    timed = (ctx.bare.generation(tokens) for _ in range(count))
    ctx.after_samples = [sample for sample in timed if sample is not None]
    ctx.after_tokens = tokens
