"""A LitGPT-compatible GPT decoder with a static KV cache (gpt-fast style).

Knows nothing of parallelism: FSDP/TP/placement are applied from outside (model/parallelize.py),
so nothing here may assume its parameters are plain, unsharded tensors after construction.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import Config


class KVCache(nn.Module):
    def __init__(
        self,
        max_batch_size: int,
        max_seq_length: int,
        n_query_groups: int,
        head_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        shape = (max_batch_size, n_query_groups, max_seq_length, head_size)
        # non-persistent: caches are scratch space, never part of a checkpoint
        self.register_buffer("k_cache", torch.zeros(shape, device=device, dtype=dtype), False)
        self.register_buffer("v_cache", torch.zeros(shape, device=device, dtype=dtype), False)

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [T], k, v: [B, G, T, hs]; B may be below max_batch_size
        b = k.shape[0]
        k_out = self.k_cache[:b]  # [B, G, S, hs], a view: writes land in the cache
        v_out = self.v_cache[:b]
        k_out[:, :, input_pos] = k
        v_out[:, :, input_pos] = v
        return k_out, v_out


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # reduce in float32: a bf16/fp16 mean of squares loses too much
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


def build_rope_cache(
    seq_len: int, n_elem: int, base: int, device: torch.device | str | None = None
) -> tuple[Tensor, Tensor]:
    """cos, sin of shape [seq_len, n_elem] in float32 (rotate-half layout, as GPT-NeoX/LitGPT)."""
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2, device=device).float() / n_elem))
    pos = torch.arange(seq_len, device=device).float()
    idx_theta = torch.outer(pos, theta)  # [S, n_elem / 2]
    idx_theta = torch.cat([idx_theta, idx_theta], dim=-1)  # [S, n_elem]
    return idx_theta.cos(), idx_theta.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, H, T, n_elem], cos/sin: [T, n_elem]
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)  # [B, H, T, n_elem]
    return (x * cos + rotated * sin).to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        hs = config.head_size
        self.n_head = config.n_head
        self.n_query_groups = config.n_query_groups
        self.head_size = hs
        self.rope_n_elem = config.rope_n_elem
        # q, k, v fused into one GEMM; layout along the output dim: [q heads | k groups | v groups]
        self.qkv = nn.Linear(
            config.n_embd, (config.n_head + 2 * config.n_query_groups) * hs, bias=config.bias
        )
        self.proj = nn.Linear(config.n_head * hs, config.n_embd, bias=config.bias)
        self.kv_cache: KVCache | None = None  # set by GPT.setup_caches

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        input_pos: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        B, T, _ = x.shape  # [B, T, E]
        nh, g, hs, n = self.n_head, self.n_query_groups, self.head_size, self.rope_n_elem
        qkv = self.qkv(x)  # [B, T, (nh + 2g) * hs]
        q, k, v = qkv.split([nh * hs, g * hs, g * hs], dim=-1)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # [B, nh, T, hs]
        k = k.view(B, T, g, hs).transpose(1, 2)  # [B, g, T, hs]
        v = v.view(B, T, g, hs).transpose(1, 2)  # [B, g, T, hs]

        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # no-ops unless caches were built in fp32
        q = torch.cat([apply_rope(q[..., :n], cos, sin), q[..., n:]], dim=-1)
        k = torch.cat([apply_rope(k[..., :n], cos, sin), k[..., n:]], dim=-1)

        if input_pos is not None:
            if self.kv_cache is None:
                raise RuntimeError("forward with input_pos needs GPT.setup_caches() first")
            k, v = self.kv_cache.update(input_pos, k, v)  # [B, g, S, hs]
            k, v = k.to(q.dtype), v.to(q.dtype)
        if g != nh:
            # query head i reads kv group i // (nh // g), matching the [q | k | v] split above
            k = k.repeat_interleave(nh // g, dim=1)  # [B, nh, S, hs]
            v = v.repeat_interleave(nh // g, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        y = y.transpose(1, 2).reshape(B, T, nh * hs)  # [B, T, nh * hs]
        return self.proj(y)  # [B, T, E]


class GptNeoxMLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))  # [B, T, E] -> [B, T, I] -> [B, T, E]


class LLaMAMLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.fc_1 = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.fc_2 = nn.Linear(config.n_embd, config.intermediate_size, bias=config.bias)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=config.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.silu(self.fc_1(x)) * self.fc_2(x))  # SwiGLU, [B, T, E]


def _norm(config: Config) -> nn.Module:
    if config.norm_class == "RMSNorm":
        return RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps)


def _mlp(config: Config) -> nn.Module:
    return LLaMAMLP(config) if config.mlp_class == "LLaMAMLP" else GptNeoxMLP(config)


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm_1 = _norm(config)
        self.attn = CausalSelfAttention(config)
        self.norm_2 = _norm(config)
        self.mlp = _mlp(config)
        self.parallel_residual = config.parallel_residual

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        input_pos: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        # x: [B, T, E]
        h = self.attn(self.norm_1(x), cos, sin, input_pos, mask)
        if self.parallel_residual:
            return x + h + self.mlp(self.norm_2(x))
        x = x + h
        return x + self.mlp(self.norm_2(x))


def _param_seed(seed: int, name: str) -> int:
    # A keyed digest, not hash() (salted per interpreter). Its low 32 bits must depend on both
    # seed and name: the CPU generator (mt19937) only uses the low 32 bits of its seed.
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class GPT(nn.Module):
    block_class = Block  # the unit strategies wrap/shard (FSDP auto-wrap, fully_shard per block)

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                ln_f=_norm(config),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        # Rope tables are made by setup_caches, not here: DDP snapshots the buffers a module has
        # when it wraps it and re-broadcasts them every forward.
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)
        self.max_seq_length = 0

    def setup_caches(
        self,
        max_batch_size: int,
        max_seq_length: int,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if max_seq_length > self.config.block_size:
            raise ValueError(
                f"max_seq_length={max_seq_length} exceeds block_size={self.config.block_size} "
                f"of config {self.config.name!r}"
            )
        # Callers that have wrapped the model (FSDP, DDP) should pass device and dtype: the
        # lm_head weight may then be a shard, a flat-parameter view or an empty placeholder, or
        # gone altogether (an earlier pipeline stage has no head).
        if device is None or dtype is None:
            weight = self.lm_head.weight
            device = weight.device if device is None else device
            dtype = weight.dtype if dtype is None else dtype
        # self.modules(), not self.transformer.h: FSDP1 replaces each block with a wrapper
        for m in self.modules():
            if isinstance(m, CausalSelfAttention):
                m.kv_cache = KVCache(
                    max_batch_size, max_seq_length, m.n_query_groups, m.head_size, device, dtype
                )
        cos, sin = build_rope_cache(
            max_seq_length, self.config.rope_n_elem, self.config.rope_base, device
        )
        self.register_buffer("cos", cos.to(dtype), persistent=False)  # [S, rope_n_elem]
        self.register_buffer("sin", sin.to(dtype), persistent=False)
        self.max_seq_length = max_seq_length

    def clear_caches(self) -> None:
        """Drop KV caches and rope tables, e.g. before a wrapper that snapshots buffers."""
        for m in self.modules():
            if isinstance(m, CausalSelfAttention):
                m.kv_cache = None
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)
        self.max_seq_length = 0

    def forward(self, idx: Tensor, input_pos: Tensor | None = None) -> Tensor:
        B, T = idx.shape  # [B, T] token ids
        if self.config.block_size < T:
            raise ValueError(f"sequence of {T} tokens exceeds block_size={self.config.block_size}")
        mask = None
        if input_pos is None:
            # no cache: plain causal attention over idx; reuse the rope tables when they fit
            if self.cos is not None and self.cos.size(0) >= T and self.cos.device == idx.device:
                cos, sin = self.cos[:T], self.sin[:T]  # [T, rope_n_elem]
            else:
                cos, sin = build_rope_cache(
                    T, self.config.rope_n_elem, self.config.rope_base, idx.device
                )
        else:
            if self.cos is None:
                raise RuntimeError("forward with input_pos needs GPT.setup_caches() first")
            cos, sin = self.cos[input_pos], self.sin[input_pos]  # [T, rope_n_elem]
            # row t may see cache slots 0..input_pos[t]; built on device, so no host sync
            slots = torch.arange(self.max_seq_length, device=idx.device)  # [S]
            mask = slots[None, :] <= input_pos[:, None]  # [T, S] bool

        x = self.transformer.wte(idx)  # [B, T, E]
        for block in self.transformer.h:
            x = block(x, cos, sin, input_pos, mask)  # [B, T, E]
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # [B, T, padded_vocab_size]

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Fill every parameter from (seed, parameter name) alone.

        Independent of construction order, device placement history (eager vs meta + to_empty)
        and dtype (draws are made in float32, then cast), so every rank of every strategy builds
        the same weights without broadcasting them. Call it before the model is parallelized:
        wrappers rename or shard parameters.
        """
        for mod_name, module in self.named_modules():
            for p_name, p in module.named_parameters(recurse=False):
                name = f"{mod_name}.{p_name}" if mod_name else p_name
                if p.is_meta:
                    raise RuntimeError(f"{name} is on the meta device; call to_empty() first")
                if p_name == "bias":
                    p.zero_()
                elif isinstance(module, (nn.LayerNorm, RMSNorm)):
                    p.fill_(1.0)
                elif isinstance(module, (nn.Linear, nn.Embedding)):
                    g = torch.Generator(device=p.device)
                    g.manual_seed(_param_seed(seed, name))
                    if p.dtype == torch.float32:
                        p.normal_(0.0, 0.02, generator=g)
                    else:
                        draw = torch.empty(p.shape, dtype=torch.float32, device=p.device)
                        p.copy_(draw.normal_(0.0, 0.02, generator=g))
                else:
                    raise TypeError(f"init_weights has no rule for {name} ({type(module)})")


def build_model(
    config: Config,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> GPT:
    """Build on meta, materialise on `device` in `dtype`, initialise from `seed`, eval mode."""
    with torch.device("meta"):
        model = GPT(config)
    # cast while still on meta so memory is only ever allocated once, in the target dtype
    model = model.to(dtype=dtype).to_empty(device=device)
    model.init_weights(seed)
    return model.eval()
