"""The optimizer of an ordinary run: AdamW, or torch's Muon on the hidden matrices with AdamW on the rest.

AdamW decays every >=2-D tensor (embedding included) and not the norm scales. Under ``optimizer.name: muon``
the blocks' 2-D matrices (q/k/v/out, gate/up/down) get ``torch.optim.Muon`` and the tied embedding/head and
the RMSNorm scales get that AdamW; ``MuonAdamW`` holds both as one optimizer (one state, one schedule).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tiny_llm.config import OptimizerConfig

MUON_MOMENTUM = 0.95
MUON_NESTEROV = True
MUON_NS_STEPS = 5
MUON_ADJUST_LR_FN = "match_rms_adamw"


def parameter_groups(params: nn.Module | list[nn.Parameter], weight_decay: float) -> list[dict]:
    """Two groups of a model's (or a list's) parameters: matrices (decayed) and vectors such as RMSNorm
    scales (not decayed)."""
    if isinstance(params, nn.Module):
        params = list(params.parameters())
    decay = [p for p in params if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in params if p.requires_grad and p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def is_hidden_matrix(name: str, shape: tuple[int, ...] | torch.Size) -> bool:
    """A transformer block's 2-D weight (attention q/k/v/out, SwiGLU gate/up/down): Muon's share."""
    return len(shape) == 2 and name.startswith("blocks.")


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The hidden matrices of ``model`` (``is_hidden_matrix``), in parameter order."""
    return [p for name, p in model.named_parameters() if p.requires_grad and is_hidden_matrix(name, p.shape)]


def muon_settings(opt: OptimizerConfig) -> dict[str, Any]:
    """torch.optim.Muon's arguments for a recipe, its nulls resolved to the documented defaults."""
    return {
        "lr": opt.lr if opt.muon_lr is None else opt.muon_lr,
        "momentum": MUON_MOMENTUM if opt.muon_momentum is None else opt.muon_momentum,
        "nesterov": MUON_NESTEROV if opt.muon_nesterov is None else opt.muon_nesterov,
        "ns_steps": MUON_NS_STEPS if opt.muon_ns_steps is None else opt.muon_ns_steps,
        "weight_decay": opt.weight_decay if opt.muon_weight_decay is None else opt.muon_weight_decay,
        "adjust_lr_fn": MUON_ADJUST_LR_FN if opt.muon_adjust_lr_fn is None else opt.muon_adjust_lr_fn,
    }


def _adamw(params: list[nn.Parameter], opt: OptimizerConfig, fused: bool) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        parameter_groups(params, opt.weight_decay),
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        fused=True if fused else None,
    )


def build_optimizer(model: nn.Module, opt: OptimizerConfig, *, fused: bool) -> torch.optim.AdamW | MuonAdamW:
    """FP32 AdamW (``fused``: the single-kernel implementation, CUDA and CPU), or MuonAdamW under muon."""
    params = [p for p in model.parameters() if p.requires_grad]
    if opt.name == "adamw":
        return _adamw(params, opt, fused)
    hidden = hidden_matrices(model)
    hidden_ids = {id(p) for p in hidden}
    settings = muon_settings(opt)
    muon = torch.optim.Muon(hidden, **settings)
    # set_lr multiplies the schedule's lr (which peaks at optimizer.lr) by this, so Muon peaks at muon_lr
    muon.param_groups[0]["lr_scale"] = settings["lr"] / opt.lr
    return MuonAdamW(muon, _adamw([p for p in params if id(p) not in hidden_ids], opt, fused))


class MuonAdamW:
    """torch.optim.Muon and torch.optim.AdamW seen as one optimizer: param_groups (Muon's first), step,
    zero_grad and one state_dict holding both.

    ``found_inf`` (a 0-dim FP32 device tensor, set by the engine's FiniteGuard) makes a step change nothing
    without a host read: fused AdamW skips itself, as under GradScaler; torch's Muon takes no found_inf, so
    its parameters and momentum buffers are copied before its step and put back with ``torch.where`` when
    found_inf is 1 (a transient copy of the hidden matrices and their buffers, on the device)."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw
        self.found_inf: torch.Tensor | None = None

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [*self.muon.param_groups, *self.adamw.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        if self.found_inf is None:
            self.muon.step()
        else:
            self._guarded_muon_step(self.found_inf)
            # torch's fused Adam/AdamW read the attribute in step() (getattr, as GradScaler sets it).
            setattr(self.adamw, "found_inf", self.found_inf)  # noqa: B010
        self.adamw.step()

    def _guarded_muon_step(self, found_inf: torch.Tensor) -> None:
        params = [p for group in self.muon.param_groups for p in group["params"] if p.grad is not None]
        for p in params:  # the zero buffer Muon's first step would create, made here so it can be restored
            self.muon.state[p].setdefault(
                "momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format)
            )
        bufs = [self.muon.state[p]["momentum_buffer"] for p in params]
        kept = [t.clone() for t in (*params, *bufs)]
        self.muon.step()
        skip = found_inf > 0
        for tensor, old in zip((*params, *bufs), kept, strict=True):
            tensor.copy_(torch.where(skip, old, tensor))

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError("not a Muon+AdamW optimizer state (a checkpoint of an AdamW run?)")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def set_lr(optimizer: torch.optim.Optimizer | MuonAdamW, lr: float) -> None:
    """The schedule's lr on every group, times the group's ``lr_scale`` where it has one (Muon's group:
    muon_lr / lr, so each part keeps its own peak; AdamW's groups get ``lr`` itself)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
