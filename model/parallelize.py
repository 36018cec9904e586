"""Parallelism applied to a built model, kept out of model.py (the torchtitan split).

FSDP2 per block; tensor parallelism by hand on LitGPT's module names; pipeline stages of
contiguous blocks that pass activations rank to rank. Each works on the reference GPT and on
LitGPT's GPT as they are (both name their parts `transformer.wte/h/ln_f` and `lm_head`); the
pipeline also on a model that names its own parts (`pipeline_parts()`: a transformers model's
adapter, pytest_distperf/ranks/hf.py).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from .generate import sample


def fully_shard_blocks(
    model: nn.Module,
    device_mesh: Any,
    reshard_after_forward: bool,
    unit_classes: tuple[type, ...] = (),
) -> nn.Module:
    """FSDP2: one unit per transformer block plus the root (embedding, final norm, head).

    `device_mesh` is the mesh Fabric's ModelParallelStrategy passes; only its data-parallel
    dimension shards parameters. With `reshard_after_forward=False` the gathered weights stay in
    place after each forward, so decode steps after the first need no all-gather at all.
    `unit_classes`: the block classes (a model without `block_class`, e.g. LitGPT's GPT).
    """
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"] if device_mesh.mesh_dim_names else device_mesh
    block_class = unit_classes or getattr(model, "block_class", None)
    units = [m for m in model.modules() if block_class is not None and isinstance(m, block_class)]
    for block in units:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


# --------------------------------------------------------------------------- tensor parallel

# The GPT classes whose blocks the built-in plan knows, and where each keeps its head counts:
# on the attention module itself, or in the attention's `config` (LitGPT).
TP_ARCHITECTURES = {
    "distperf_model.model.GPT": "module",
    "litgpt.model.GPT": "config",
}


def tp_mesh(device_mesh: Any) -> Any:
    """The tensor-parallel dimension of Fabric's (data_parallel, tensor_parallel) mesh."""
    names = device_mesh.mesh_dim_names or ()
    return device_mesh["tensor_parallel"] if "tensor_parallel" in names else device_mesh


@dataclass(frozen=True)
class LinearSplit:
    """How `tensor_parallel` split one linear by hand; what the sharding description and the
    communication slow-down read, where a DTensor plan has placements instead."""

    style: str  # "colwise": this rank's output rows; "rowwise": its input columns, all-reduced
    ways: int  # ranks in the tensor-parallel group


# The attribute a split linear carries its LinearSplit in.
SPLIT_ATTR = "distperf_tp_split"
# Where a row-wise linear keeps its whole bias: out of nn.Linear's reach, so that the forward
# hook adds it once, after the all-reduce (sum of the partial products, then the bias).
ROWWISE_BIAS = "bias_after_all_reduce"


def tensor_parallel(model: nn.Module, device_mesh: Any, training: bool = False) -> nn.Module:
    """LitGPT's tensor parallelism (litgpt/generate/tp.py), done by hand as that file does it.

    In every block the fused q/k/v and the MLP's input projections are split column-wise (by
    heads and by the hidden dimension) and the two output projections row-wise, so each block
    all-reduces twice: after attention and after the MLP. The embedding, the norms and the head
    stay whole on every rank, as in LitGPT, so every rank samples the same token.

    Each split linear keeps plain tensors, this rank's slice of the whole, and a row-wise one
    sums its output over the group in a forward hook. Not DTensor's `parallelize_module`: its
    eager dispatch around every sharded linear made tp on one H200 rank much slower
    than the plain model (docs/benchmarks/h200-2026-12-01-pool.md). On one rank nothing is
    split and no hook is added: the model is the plain one.

    `training`: each block's attention and MLP also sum their input's gradient over the group
    in backward (each rank's column slices saw only their share of it), and the row-wise sums
    let the gradient through unchanged, as Megatron-LM's f and g operators do.
    """
    root, heads_on = _tp_root(model)
    mesh = tp_mesh(device_mesh)
    n = mesh.size()
    rank = mesh.get_local_rank() if n > 1 else 0
    group = mesh.get_group() if n > 1 else None
    local_configs: dict[int, Any] = {}
    for i, block in enumerate(root.transformer.h):
        attn, mlp = block.attn, block.mlp
        # `attn` is older LitGPT's name, whose rows are grouped per query group already.
        qkv_name = "qkv" if isinstance(getattr(attn, "qkv", None), nn.Linear) else "attn"
        heads, groups = _head_counts(attn, heads_on, f"transformer.h[{i}].attn")
        mlp_in = _mlp_inputs(mlp, f"transformer.h[{i}].mlp")
        width = getattr(mlp, mlp_in[0]).out_features
        for what, size in (("n_head", heads), ("n_query_groups", groups), ("MLP width", width)):
            if size % n:
                raise ValueError(f"tp: {what}={size} is not divisible by {n} ranks")
        if qkv_name == "qkv" and n > 1:
            _group_qkv_by_rank(attn.qkv, heads, groups, n)
        # Every rank built the same weights from the seed: each keeps its slice, nothing is sent.
        for linear in [getattr(attn, qkv_name)] + [getattr(mlp, name) for name in mlp_in]:
            _split_linear(linear, "colwise", rank, n, group)
        for linear in (attn.proj, mlp.proj):
            _split_linear(linear, "rowwise", rank, n, group)
        if n > 1:
            _set_local_heads(attn, heads_on, heads // n, groups // n, local_configs)
        if n > 1 and training:
            for part in (attn, mlp):
                part.register_forward_pre_hook(partial(_sum_input_gradient, group))
    return model


def row_parallel_points(model: nn.Module) -> list[nn.Module]:
    """The modules after whose output `tensor_parallel` sums over the ranks, in forward order:
    each block's attention and MLP output projections (on the whole model, before any split)."""
    root, _ = _tp_root(model)
    return [linear for block in root.transformer.h for linear in (block.attn.proj, block.mlp.proj)]


def _split_linear(linear: nn.Linear, style: str, rank: int, n: int, group: Any) -> None:
    """Keep this rank's contiguous slice of `linear` (its output rows, or its input columns)."""
    setattr(linear, SPLIT_ATTR, LinearSplit(style, n))
    if n == 1:
        return
    dim = 0 if style == "colwise" else 1
    # A copy, not a view: a view would keep the whole weight's storage alive.
    shard = linear.weight.chunk(n, dim)[rank].clone()
    linear.weight = nn.Parameter(shard, requires_grad=linear.weight.requires_grad)
    bias = linear.bias
    if style == "colwise":
        linear.out_features = shard.shape[0]
        if bias is not None:
            linear.bias = nn.Parameter(bias.chunk(n)[rank].clone(), bias.requires_grad)
        return
    linear.in_features = shard.shape[1]
    if bias is not None:
        linear.register_parameter("bias", None)
        linear.register_parameter(ROWWISE_BIAS, bias)
    linear.register_forward_hook(partial(_all_reduce_output, group))


class _SumOverGroup(torch.autograd.Function):
    """Forward: the partial outputs summed over the group. Backward: every rank's loss already
    sees the whole sum, so the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx: Any, output: Tensor, group: Any) -> Tensor:
        torch.distributed.all_reduce(output, group=group)
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _SumGradientOverGroup(torch.autograd.Function):
    """Forward: the input as it is. Backward: its gradient summed over the group, since each
    rank's column slices saw only their share of it."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


def _sum_input_gradient(group: Any, module: nn.Module, args: tuple[Any, ...]) -> Any:
    if not (torch.is_grad_enabled() and args and args[0].requires_grad):
        return None
    return (_SumGradientOverGroup.apply(args[0], group), *args[1:])


def _all_reduce_output(group: Any, module: nn.Module, args: Any, output: Tensor) -> Tensor:
    """Sum a row-wise linear's partial output over the group, then add its bias once."""
    if torch.is_grad_enabled() and output.requires_grad:
        output = _SumOverGroup.apply(output, group)
    elif torch.compiler.is_compiling():
        from torch.distributed._functional_collectives import all_reduce

        output = all_reduce(output, "sum", group)  # traceable into the compiled graph
    else:
        torch.distributed.all_reduce(output, group=group)  # in place: the least host work
    bias = getattr(module, ROWWISE_BIAS, None)
    return output if bias is None else output + bias


def _tp_root(model: nn.Module) -> tuple[nn.Module, str]:
    """The GPT inside `model` (the model itself, or the one an adapter wraps) and its kind."""
    for module in model.modules():
        kind = type(module)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if name in TP_ARCHITECTURES:
            return module, TP_ARCHITECTURES[name]
    kind = type(model)
    raise TypeError(
        f"tp: no tensor-parallel plan for {kind.__module__}.{kind.__qualname__}: the built-in "
        f"one knows {', '.join(TP_ARCHITECTURES)}; name your own with "
        "@pytest.mark.distperf(tp_plan='package.module:function'), a function "
        "(model, tp_mesh) -> model"
    )


def _head_counts(attn: nn.Module, heads_on: str, where: str) -> tuple[int, int]:
    holder = attn if heads_on == "module" else attn.config
    olmo2 = getattr(holder, "norm_qk", False) and getattr(holder, "norm_qk_type", "") == "olmo2"
    if heads_on == "config" and olmo2:
        raise TypeError(f"tp: {where} normalises q and k across all heads (olmo2)")
    return int(holder.n_head), int(holder.n_query_groups)


def _mlp_inputs(mlp: nn.Module, where: str) -> list[str]:
    names = [n for n in ("fc", "fc_1", "fc_2") if isinstance(getattr(mlp, n, None), nn.Linear)]
    if not names or not isinstance(getattr(mlp, "proj", None), nn.Linear):
        raise TypeError(
            f"tp: {where} ({type(mlp).__name__}) is not a dense MLP with fc/fc_1/fc_2 and proj"
        )
    return names


def _group_qkv_by_rank(qkv: nn.Linear, heads: int, groups: int, n: int) -> None:
    """Reorder the fused [q heads | k groups | v groups] rows into one [q | k | v] block per
    rank, so that the column-wise split hands each rank whole heads with their own groups."""
    head_size = qkv.out_features // (heads + 2 * groups)
    q, kv = heads * head_size, groups * head_size
    rows = torch.arange(qkv.out_features, device=qkv.weight.device)
    parts = zip(rows[:q].chunk(n), rows[q : q + kv].chunk(n), rows[q + kv :].chunk(n), strict=True)
    order = torch.cat([torch.cat(part) for part in parts])
    with torch.no_grad():
        qkv.weight.copy_(qkv.weight[order])
        if qkv.bias is not None:
            qkv.bias.copy_(qkv.bias[order])


def _set_local_heads(
    attn: nn.Module, heads_on: str, heads: int, groups: int, configs: dict[int, Any]
) -> None:
    if heads_on == "module":
        attn.n_head, attn.n_query_groups = heads, groups
        return
    # LitGPT reads the counts from a config its blocks share: one local copy for all of them,
    # leaving the caller's config (and any whole copy built from it) as it was.
    shared = attn.config
    if id(shared) not in configs:
        local = copy.copy(shared)
        local.n_head, local.n_query_groups = heads, groups
        configs[id(shared)] = local
    attn.config = configs[id(shared)]


def delay_row_parallel_outputs(model: nn.Module, seconds: float) -> int:
    """Sleep `seconds` after every row-wise linear's output all-reduce, whichever plan placed
    it (the communication-only slow-down self-check); returns how many were found."""
    found = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and _linear_split(module) == "rowwise":
            # Hooks run in order: after the by-hand all-reduce, or DTensor's own.
            module.register_forward_hook(partial(_sleep_after, seconds))
            found += 1
    return found


def _sleep_after(seconds: float, module: nn.Module, args: Any, output: Any) -> None:
    time.sleep(seconds)


def describe_tensor_parallel(model: nn.Module) -> str:
    """How `model`'s linears are really split: the by-hand split's marks, or the DTensor
    placements that a plan of the user's (`tp_plan`) left."""
    counts = {"colwise": 0, "rowwise": 0}
    ways, dtensor = 1, False
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            continue
        style = _linear_split(module)
        if style is None:
            continue
        counts[style] += 1
        split = getattr(module, SPLIT_ATTR, None)
        if split is not None:
            ways = max(ways, split.ways)
        else:
            ways, dtensor = max(ways, module.weight.device_mesh.size()), True
    if not counts["colwise"] + counts["rowwise"]:
        return "replicated"
    how = " DTensor" if dtensor else ""
    return (
        f"TP {ways}-way{how}: {counts['colwise']} column-wise, {counts['rowwise']} row-wise linears"
    )


def _linear_split(linear: nn.Linear) -> str | None:
    """The split's style ("colwise", "rowwise") from the by-hand mark or the weight's DTensor
    placement; None for a whole linear."""
    split = getattr(linear, SPLIT_ATTR, None)
    if split is not None:
        return split.style
    from torch.distributed.tensor import DTensor, Shard

    weight = linear.weight
    if not isinstance(weight, DTensor):
        return None
    dims = {p.dim for p in weight.placements if isinstance(p, Shard)}
    if dims & {1, -1}:
        return "rowwise"
    return "colwise" if 0 in dims else None


# --------------------------------------------------------------------------- pipeline


def split_blocks(n_blocks: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous [start, stop) block ranges, one per stage; the first stages take the extras."""
    if stages < 1 or n_blocks < stages:
        raise ValueError(f"pipeline: {stages} stages need at least {stages} blocks, got {n_blocks}")
    size, extra = divmod(n_blocks, stages)
    bounds, start = [], 0
    for stage in range(stages):
        stop = start + size + (stage < extra)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


Part = tuple[nn.Module, str]  # (owner, attribute): where a stage keeps or drops one part


def _pipeline_parts(model: nn.Module) -> tuple[Part, Part, Part, Part]:
    """Where the embedding, the blocks' list, the final norm and the head live: the model's own
    `pipeline_parts()` (a transformers model's adapter), else LitGPT's names."""
    own = getattr(model, "pipeline_parts", None)
    if callable(own):
        return own()
    root = _pipeline_root(model)
    t = root.transformer
    return (t, "wte"), (t, "h"), (t, "ln_f"), (root, "lm_head")


def _pipeline_root(model: nn.Module) -> nn.Module:
    """The GPT inside `model`: the first module with `transformer.wte/h/ln_f` and `lm_head`."""
    for module in model.modules():
        transformer = getattr(module, "transformer", None)
        parts = ("wte", "h", "ln_f")
        if isinstance(getattr(module, "lm_head", None), nn.Module) and all(
            hasattr(transformer, part) for part in parts
        ):
            return module
    raise TypeError(
        f"pipeline: {type(model).__name__} has no GPT with transformer.wte, transformer.h, "
        "transformer.ln_f and lm_head (LitGPT's names) to split into stages"
    )


class _NoEmbedding(nn.Module):
    """A later stage's stand-in for the embedding: the activation arrives from the stage before."""

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.width, self.dtype = width, dtype

    def forward(self, idx: Tensor) -> Tensor:
        return torch.empty(*idx.shape, self.width, device=idx.device, dtype=self.dtype)


class _NoHead(nn.Module):
    """An earlier stage's stand-in for the head: its output went on to the next stage."""

    def forward(self, x: Tensor) -> Tensor:
        return x[..., :0]  # [B, T, 0]


class PipelineStage(nn.Module):
    """This rank's contiguous blocks of a GPT-like model: LitGPT's `sequentially.py` split,
    across processes instead of devices of one process.

    `module` is the model itself with the other stages' blocks dropped: the embedding only on
    the first stage, the final norm and head only on the last. A stage's first block receives
    its input from the stage before and its last block sends its output on; the last stage
    samples and sends the token back to the first, which needs it for the next step, and to
    the stages between, which need it only to report the same tokens.
    """

    def __init__(
        self, model: nn.Module, rank: int, world_size: int, comm_delay_s: float = 0.0
    ) -> None:
        super().__init__()
        self.module = model
        self.rank, self.world_size, self.comm_delay_s = rank, world_size, comm_delay_s
        self.last = world_size - 1
        embedding, blocks_at, norm, head = _pipeline_parts(model)
        blocks = list(getattr(*blocks_at))
        self.n_blocks = len(blocks)
        self.stages = split_blocks(len(blocks), world_size)
        start, stop = self.stages[rank]
        kept = nn.ModuleList(blocks[start:stop])
        setattr(*blocks_at, kept)
        wte = getattr(*embedding)
        if rank > 0:
            setattr(*embedding, _NoEmbedding(wte.embedding_dim, wte.weight.dtype))
            kept[0].register_forward_pre_hook(self._receive, with_kwargs=True)
        if rank < self.last:
            kept[-1].register_forward_hook(self._send_on)
            setattr(*norm, nn.Identity())
            setattr(*head, _NoHead())

    def forward(self, idx: Tensor, input_pos: Tensor | None = None) -> Tensor:
        """Logits [B, T, V] on the last stage; [B, T, 0] on the others."""
        return self.module(idx, input_pos)

    @torch.no_grad()
    def next_token(self, idx: Tensor, input_pos: Tensor) -> Tensor:
        """One forward through every stage; the greedy next token [B, 1] on every rank."""
        logits = self.forward(idx, input_pos)
        if self.rank == self.last:
            token = sample(logits[:, -1])  # [B, 1]
            for stage in range(self.last):  # the first stage's copy first: it waits for it
                self._send(token, stage)
            return token
        token = torch.empty(idx.shape[0], 1, dtype=torch.long, device=idx.device)
        torch.distributed.recv(token, src=self.last)
        return token

    def describe(self) -> str:
        sizes = "+".join(str(stop - start) for start, stop in self.stages)
        return f"pipeline {self.world_size} stages of {sizes} blocks (send/recv)"

    def _send(self, tensor: Tensor, dst: int) -> None:
        if self.comm_delay_s:  # the communication-only slow-down self-check
            time.sleep(self.comm_delay_s)
        torch.distributed.send(tensor.contiguous(), dst)

    def _receive(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        x = args[0] if args else kwargs["x"]
        arrived = torch.empty_like(x)  # [B, T, E]
        torch.distributed.recv(arrived, src=self.rank - 1)
        if args:
            return (arrived, *args[1:]), kwargs
        return args, {**kwargs, "x": arrived}

    def _send_on(self, module: nn.Module, args: Any, output: Tensor) -> None:
        self._send(output, self.rank + 1)
