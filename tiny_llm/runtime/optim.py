"""AdamW with decay on every >=2-D tensor (embedding included) and none on norm scales."""

from __future__ import annotations

import torch
from torch import nn

from tiny_llm.config import OptimizerConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: matrices (decayed) and vectors such as RMSNorm scales (not decayed)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, opt: OptimizerConfig, *, fused: bool) -> torch.optim.AdamW:
    """FP32 AdamW; ``fused`` selects the single-kernel implementation (CUDA and CPU)."""
    return torch.optim.AdamW(
        parameter_groups(model, opt.weight_decay),
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        fused=True if fused else None,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
