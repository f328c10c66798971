"""Packed Llama: N workers of tiny_llm.model.Llama computed by one set of batched kernels.

Parameters are views into one arena ``[N, D_padded]``; each view is registered as a
leaf parameter whose ``.grad`` is preassigned as a view into a gradient arena of the
same layout, so backward accumulates straight into one contiguous tensor. Every
Linear is one ``torch.bmm`` over ``[N, batch*L, in]``, the embedding gathers worker i's
rows from row i of the ``[N, V, d]`` arena view (no copy of the table) and attention
runs once over ``[N*batch, heads, L, head_dim]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tiny_llm.config import ModelConfig
from tiny_llm.model import IGNORE_INDEX, Llama, apply_rope, reference_attention
from tiny_llm.packed.layout import ArenaLayout
from tiny_llm.packed.muon import muon_order


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, M, in] @ weight[N, out, in]^T -> [N, M, out] as one batched GEMM."""
    return torch.bmm(x, weight.transpose(1, 2))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same as tiny_llm.model.RMSNorm (FP32 reduction), with a per-worker scale [N, d]."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.unsqueeze(1)).type_as(x)


class PackedLlama(nn.Module):
    """inputs [N, b, t] int64 -> logits [N, b*t, V]; worker i uses row i of every arena."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self,
        template: Llama,
        num_models: int,
        device: torch.device,
        *,
        reference_attention: bool = False,
        muon_layout: bool = False,
    ) -> None:
        super().__init__()
        self.cfg: ModelConfig = template.cfg
        self.num_models = num_models
        self.reference = reference_attention
        named: list[tuple[str, torch.Tensor]] = list(template.named_parameters())
        if muon_layout:  # hidden matrices last, grouped by shape: PackedMuon's batched views need it
            named = muon_order(named)
        self.layout = ArenaLayout.from_shapes((name, tuple(p.shape)) for name, p in named)
        self.arena = torch.zeros(num_models, self.layout.width, device=device)
        self.grad_arena = torch.zeros_like(self.arena)
        params = []
        with torch.no_grad():
            for entry, (_, source) in zip(self.layout.entries, named, strict=True):
                view = self.layout.view(self.arena, entry)
                view.copy_(source.detach().to(device).expand_as(view))  # every worker: the same init
                param = nn.Parameter(view)  # aliases the arena
                param.grad = self.layout.view(self.grad_arena, entry)  # backward accumulates in place
                params.append(param)
        self.params = nn.ParameterList(params)
        self._index = {e.name: i for i, e in enumerate(self.layout.entries)}
        self.register_buffer("rope_cos", template.rope_cos.to(device), persistent=False)
        self.register_buffer("rope_sin", template.rope_sin.to(device), persistent=False)

    def weight(self, name: str) -> torch.Tensor:
        return self.params[self._index[name]]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        n, b, t = inputs.shape
        cfg = self.cfg
        if n != self.num_models or t > cfg.context_length:
            raise ValueError(
                f"inputs {tuple(inputs.shape)} do not fit [{self.num_models}, b, <= {cfg.context_length}]"
            )
        w = self.weight
        # Worker i's rows of its own [V, d] table, gathered straight from the arena: the [N, V, d] view has
        # the arena's row stride, so flattening it to one [N*V, d] table would copy it on every step.
        workers = torch.arange(n, device=inputs.device).view(n, 1, 1)
        x = w("embed.weight")[workers, inputs.contiguous()].view(n, b * t, cfg.width)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        heads, head_dim = cfg.num_heads, cfg.width // cfg.num_heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(n * b, t, heads, head_dim).transpose(1, 2)

        for i in range(cfg.num_layers):
            p = f"blocks.{i}."
            h = _rms_norm(x, w(p + "attn_norm.weight"), cfg.norm_eps)
            q = apply_rope(split(_linear(h, w(p + "attn.q_proj.weight"))), cos, sin)
            k = apply_rope(split(_linear(h, w(p + "attn.k_proj.weight"))), cos, sin)
            v = split(_linear(h, w(p + "attn.v_proj.weight")))
            if self.reference:
                y = reference_attention(q, k, v)
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(n, b * t, cfg.width)
            x = x + _linear(y, w(p + "attn.out_proj.weight"))
            h = _rms_norm(x, w(p + "ffn_norm.weight"), cfg.norm_eps)
            gate = _linear(h, w(p + "ffn.gate_proj.weight"))
            x = x + _linear(
                F.silu(gate) * _linear(h, w(p + "ffn.up_proj.weight")), w(p + "ffn.down_proj.weight")
            )
        return _linear(_rms_norm(x, w("norm.weight"), cfg.norm_eps), w("embed.weight"))  # tied head

    @torch.no_grad()
    def copy_average_to(self, model: Llama) -> None:
        """Load the FP32 mean of the workers into an ordinary model (padding is never copied)."""
        mean = self.arena.float().mean(dim=0, keepdim=True)
        params = dict(model.named_parameters())
        for entry in self.layout.entries:
            params[entry.name].copy_(self.layout.view(mean, entry)[0])

    @torch.no_grad()
    def worker_state_dict(self, worker: int) -> dict[str, torch.Tensor]:
        """Worker ``worker``'s weights under the ordinary model's parameter names."""
        return {e.name: self.layout.view(self.arena, e)[worker].clone() for e in self.layout.entries}


def local_losses(model: PackedLlama, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[N] per-worker mean FP32 cross entropy over valid targets; their sum is the training loss."""
    logits = model(inputs)
    n = logits.shape[0]
    flat = F.cross_entropy(
        logits.float().flatten(0, 1), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(n, -1)
    counts = (targets.reshape(n, -1) != IGNORE_INDEX).sum(dim=1).clamp_min(1)
    return flat.sum(dim=1) / counts
