"""Llama-style decoder: pre-norm blocks, RMSNorm, RoPE, multi-head attention, SwiGLU, tied embedding.

One file, readable in one sitting. Two attention paths share the weights:
``sdpa`` (PyTorch's fused kernels, causal) and ``reference`` (explicit QK^T,
mask and softmax in FP32; supports double backward, used by deterministic runs).
``Llama.decode`` runs new positions against a ``KVCache`` of the earlier ones (generation);
training and evaluation never touch it.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from tiny_llm.config import ModelConfig

IGNORE_INDEX = -100


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in FP32, or unchanged when it is FP64 (the second-order analysis and its tests run in FP64)."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    """Scale-only RMS normalisation; the reduction runs in FP32 (FP64 input: FP64) whatever the dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = at_least_fp32(x)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).type_as(x)


def rope_tables(context_length: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 cos/sin tables [L, head_dim] for rotate-half RoPE.

    Computed as transformers' LlamaRotaryEmbedding computes them (inverse frequencies and angles in FP32),
    so that a model exported to Hugging Face (``tiny_llm.export``) sees the very tables it was trained with:
    FP64 angles rounded to FP32 differ from those by up to ~7e-5 at position 1024, and the logits with them.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.arange(context_length, dtype=torch.float32)[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, h, t, hd]; cos/sin [t, hd]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention in FP32 throughout (FP64 for FP64 input; double-backward capable, deterministic).

    Autocast is switched off inside: it would recast both matmuls to BF16, and the parity check of the fast
    path against this one would then compare BF16 with BF16. The t queries are the last t of the s keys'
    positions (s = t except when decoding with a cache).
    """
    t, s = q.shape[-2], k.shape[-2]
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = at_least_fp32(q) @ at_least_fp32(k).transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        scores = scores.masked_fill(~mask, float("-inf"))
        out = scores.softmax(dim=-1) @ at_least_fp32(v)
    return out.to(q.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, reference: bool) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.width // cfg.num_heads
        self.reference = reference
        self.q_proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.k_proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.v_proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.out_proj = nn.Linear(cfg.width, cfg.width, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = apply_rope(self._heads(self.q_proj(x)), cos, sin)
        k = apply_rope(self._heads(self.k_proj(x)), cos, sin)
        v = self._heads(self.v_proj(x))
        if self.reference:
            y = reference_attention(q, k, v)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))

    def decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, layer: int
    ) -> torch.Tensor:
        """``forward`` for positions cache.length.. of x, attending to the cached keys/values as well."""
        b, t, d = x.shape
        q = apply_rope(self._heads(self.q_proj(x)), cos, sin)
        k, v = cache.append(
            layer, apply_rope(self._heads(self.k_proj(x)), cos, sin), self._heads(self.v_proj(x))
        )
        if self.reference:
            y = reference_attention(q, k, v)
        elif t == 1:  # one new query sees every cached position: no mask
            y = F.scaled_dot_product_attention(q, k, v)
        elif t == k.shape[-2]:  # an empty cache: the ordinary causal case
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(t, k.shape[-2], dtype=torch.bool, device=x.device).tril(k.shape[-2] - t)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.width, cfg.ffn_width, bias=False)
        self.up_proj = nn.Linear(cfg.width, cfg.ffn_width, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_width, cfg.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, reference: bool) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.attn = Attention(cfg, reference)
        self.ffn_norm = RMSNorm(cfg.width, cfg.norm_eps)
        self.ffn = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))

    def decode(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, layer: int
    ) -> torch.Tensor:
        x = x + self.attn.decode(self.attn_norm(x), cos, sin, cache, layer)
        return x + self.ffn(self.ffn_norm(x))


class KVCache:
    """Keys and values of the positions decoded so far: one preallocated [b, heads, L, head_dim] pair per
    layer, filled from position 0 up to ``length``."""

    def __init__(self, cfg: ModelConfig, batch_size: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (batch_size, cfg.num_heads, cfg.context_length, cfg.width // cfg.num_heads)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v [b, heads, t, head_dim] at positions length..length+t; return all keys/values so far."""
        end = self.length + k.shape[-2]
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class Llama(nn.Module):
    """inputs [b, t<=L] int64 -> logits [b, t, V]."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, *, reference_attention: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg, reference_attention) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.width, cfg.norm_eps)
        cos, sin = rope_tables(cfg.context_length, cfg.width // cfg.num_heads, cfg.rope_theta)
        # Cached, not recomputed per step; non-persistent so checkpoints hold parameters only.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        residual_std = std / math.sqrt(2 * self.cfg.num_layers)
        for block in cast("list[Block]", self.blocks):
            nn.init.normal_(block.attn.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.ffn.down_proj.weight, mean=0.0, std=residual_std)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return F.linear(self.hidden_states(inputs), self.embed.weight)  # tied LM head

    def hidden_states(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs [b, t<=L] -> the final-normed hidden states [b, t, width] that the LM head reads."""
        t = inputs.shape[-1]
        if t > self.cfg.context_length:
            raise ValueError(f"input length {t} exceeds model.context_length {self.cfg.context_length}")
        x = self.embed(inputs)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)

    def decode(self, inputs: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """inputs [b, t] at positions cache.length.. -> logits [b, t, V]; their keys/values join the cache."""
        start, t = cache.length, inputs.shape[-1]
        if start + t > self.cfg.context_length:
            raise ValueError(
                f"positions up to {start + t} exceed model.context_length {self.cfg.context_length}"
            )
        x = self.embed(inputs)
        cos, sin = self.rope_cos[start : start + t], self.rope_sin[start : start + t]
        for layer, block in enumerate(cast("list[Block]", self.blocks)):
            x = block.decode(x, cos, sin, cache, layer)
        cache.length = start + t
        return F.linear(self.norm(x), self.embed.weight)


def loss_sum(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed FP32 cross entropy over valid targets (ignore_index -100)."""
    logits = model(inputs)
    return F.cross_entropy(
        at_least_fp32(logits).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def token_losses(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-target FP32 cross entropy (0 where ignored), for FP64 accumulation in evaluation."""
    logits = model(inputs)
    return F.cross_entropy(
        at_least_fp32(logits).flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )


def chunked_token_losses(
    model: Llama, inputs: torch.Tensor, targets: torch.Tensor, rows: int
) -> torch.Tensor:
    """``token_losses`` computed ``rows`` positions at a time from the final hidden states.

    Each chunk's logits are made, reduced to logsumexp minus the target's logit in FP32, and dropped: no
    [b*t, V] FP32 copy or log-softmax is ever written, and a chunk's logits stay in cache for its reduction.
    Compiled (``tiny_llm.train.evaluate``), each chunk is one matmul and one fused reduction.
    """
    hidden, flat = model.hidden_states(inputs).flatten(0, 1), targets.flatten()
    losses = []
    for h, t in zip(hidden.split(rows), flat.split(rows), strict=True):
        logits = at_least_fp32(F.linear(h, model.embed.weight))
        picked = logits.gather(-1, t.clamp_min(0).unsqueeze(-1)).squeeze(-1)
        losses.append(torch.where(t != IGNORE_INDEX, torch.logsumexp(logits, -1) - picked, 0.0))
    return torch.cat(losses)


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (the tied embedding counted once)."""
    return sum(p.numel() for p in model.parameters())
