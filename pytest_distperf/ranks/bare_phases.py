"""The bare model's phases (ranks/bare.py) around wrapping, and a replicated model's reference
timed after the repeats (ranks/reference.py)."""

from __future__ import annotations

import copy

import torch

from pytest_distperf.ranks import memory
from pytest_distperf.ranks.bare import BareCopy
from pytest_distperf.ranks.context import RankContext
from pytest_distperf.ranks.models import build
from pytest_distperf.ranks.reference import generations_after, tokens_after


def copy_whole(ctx: RankContext) -> None:
    """A sharded model's bare copy taken before wrapping shards it where memory is an RSS heap
    (no device to run out of), its own KV cache made: cheaper than building it again."""
    if not ctx.copies_whole:
        return
    workload, rss = ctx.workload, memory.peak(ctx.device)[0]
    try:
        module = copy.deepcopy(ctx.model.module)
    except Exception:  # noqa: BLE001 - a module that cannot be copied is built again
        ctx.bare = _built_whole(ctx)
        return
    length = workload.prompt_length + workload.max_new_tokens
    ctx.model.setup_caches(workload.batch_size, length, ctx.device, ctx.dtype, module=module)
    ctx.bare = BareCopy(
        module, ctx.prompt, workload.max_new_tokens, ctx.generate, rss_before_copy=rss
    )


def bare_copy(ctx: RankContext) -> None:
    """The bare model once wrapped: a sharded model's whole copy beside every repeat where the
    relative speed is measured (unless copied before wrapping); a replicated model's own
    module, which is the same object."""
    workload, sharded = ctx.workload, ctx.record.sharded
    if ctx.bare is not None:
        return
    if sharded and ctx.bare_beside:
        ctx.bare = _built_whole(ctx)
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


def _built_whole(ctx: RankContext) -> BareCopy:
    """A sharded rank's whole copy with its own KV cache, built from the seed once wrapping has
    freed the unsharded weights; none where it does not fit (on a GPU as much memory again must
    stay free: what the wrapped run gathers, fsdp-noreshard's all)."""
    workload, device, exact = ctx.workload, ctx.device, ctx.platform.allocator_memory
    rss = None if exact else memory.peak(device)[0]
    allocated = torch.cuda.memory_allocated(device) if exact else 0
    try:
        built = build(workload, device, ctx.dtype, ctx.spec.test_dir)
        length = workload.prompt_length + workload.max_new_tokens
        built.setup_caches(workload.batch_size, length, device, ctx.dtype)
        module: torch.nn.Module | None = built.module
        del built  # the module alone holds the copy: dropping it below frees it
    except torch.cuda.OutOfMemoryError:
        module = None
    copy_bytes = torch.cuda.memory_allocated(device) - allocated if exact else 0
    if exact and (module is None or torch.cuda.mem_get_info(device)[0] < copy_bytes):
        module, copy_bytes = None, 0
        torch.cuda.empty_cache()
    return BareCopy(module, ctx.prompt, workload.max_new_tokens, ctx.generate, copy_bytes, rss)
