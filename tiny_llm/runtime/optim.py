"""The optimizer of an ordinary run: AdamW, or Muon on the hidden matrices with AdamW on the rest.

AdamW decays every >=2-D tensor (embedding included) and not the norm scales. Under ``optimizer.name: muon``
the blocks' 2-D matrices (q/k/v/out, gate/up/down) get ``BatchedMuon`` (torch's Muon, stepped as one batched
Newton-Schulz chain per matrix shape) and the tied embedding/head and the RMSNorm scales get that AdamW;
``MuonAdamW`` holds both as one optimizer (one state, one schedule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# torch's own coefficients, norm clamp and per-shape LR scale: the batched chain must give what
# torch.optim.Muon gives per matrix, so they are taken from torch rather than copied.
from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS, _adjust_lr

from tiny_llm.config import MuonConfig, OptimizerConfig


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
    """torch.optim.Muon's arguments for a recipe: its muon section, lr and weight decay AdamW's when null."""
    muon = opt.muon or MuonConfig()
    return {
        "lr": opt.lr if muon.lr is None else muon.lr,
        "momentum": muon.momentum,
        "nesterov": muon.nesterov,
        "ns_steps": muon.ns_steps,
        "weight_decay": opt.weight_decay if muon.weight_decay is None else muon.weight_decay,
        "adjust_lr_fn": muon.adjust_lr_fn,
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
    muon = BatchedMuon(hidden, **settings)
    # set_lr multiplies the schedule's lr (which peaks at optimizer.lr) by this, so Muon peaks at muon.lr
    muon.param_groups[0]["lr_scale"] = settings["lr"] / opt.lr
    return MuonAdamW(muon, _adamw([p for p in params if id(p) not in hidden_ids], opt, fused))


@torch.no_grad()
def batched_newton_schulz(
    grads: torch.Tensor,
    steps: int,
    coefficients: tuple[float, float, float] = (DEFAULT_A, DEFAULT_B, DEFAULT_C),
    eps: float = EPS,
) -> torch.Tensor:
    """torch's ``_zeropower_via_newtonschulz`` on a [B, rows, cols] stack at once (BF16, tall matrices
    transposed, each matrix divided by its Frobenius norm clamped at ``eps``, the quintic with torch's
    coefficients); on the CPU it equals torch's per-matrix result bit for bit."""
    a, b, c = coefficients
    x = grads.bfloat16()
    tall = grads.shape[-2] > grads.shape[-1]
    if tall:
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


# At most this many elements per stacked tensor: a step's transient copies (gradients, buffers, weights and
# their new values, stacked per shape) stay a few hundred MiB whatever the model.
MUON_CHUNK_ELEMENTS = 1 << 26


def shape_chunks(params: list[torch.Tensor]) -> list[list[int]]:
    """Indices of ``params`` grouped by shape, each group cut into chunks of at most MUON_CHUNK_ELEMENTS."""
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for index, param in enumerate(params):
        if param.ndim != 2:
            raise ValueError("Muon steps 2-D matrices only")
        by_shape.setdefault(tuple(param.shape), []).append(index)
    chunks = []
    for indices in by_shape.values():
        per_chunk = max(1, MUON_CHUNK_ELEMENTS // params[indices[0]].numel())
        chunks += [indices[start : start + per_chunk] for start in range(0, len(indices), per_chunk)]
    return chunks


class BatchedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` (its arguments, groups and state_dict, so either resumes the other's state)
    stepped per matrix shape: momentum, one batched Newton-Schulz chain (``batched_newton_schulz``), decay
    and the step for all the shape's matrices at once, a handful of operators per shape instead of about
    twenty per matrix. Equal to torch's step within FP32 rounding (bit for bit on the CPU).

    ``found_inf`` (a 0-dim FP32 device tensor, or None) makes a step change nothing when it is 1, without a
    host read: the new weights and buffers are computed and ``torch.where`` keeps the old ones."""

    found_inf: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        skip = None if self.found_inf is None else self.found_inf > 0
        for group in self.param_groups:
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            bufs: list[torch.Tensor] = []
            self._init_group(group, params, grads, bufs)  # torch's: the lazy zero buffers, its checks
            for chunk in shape_chunks(params):
                pick = [params[i] for i in chunk], [grads[i] for i in chunk], [bufs[i] for i in chunk]
                self._step_shape(group, *pick, skip)

    def _step_shape(
        self,
        group: dict[str, Any],
        params: list[torch.Tensor],
        grads: list[torch.Tensor],
        bufs: list[torch.Tensor],
        skip: torch.Tensor | None,
    ) -> None:
        """torch's ``_single_tensor_muon`` for k matrices of one shape at once."""
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        stacked_grads, stacked_bufs = torch.stack(grads), torch.stack(bufs)
        new_bufs = stacked_bufs.lerp(stacked_grads, 1 - momentum)
        update = stacked_grads.lerp_(new_bufs, momentum) if group["nesterov"] else new_bufs
        ortho = batched_newton_schulz(update, group["ns_steps"], group["ns_coefficients"], group["eps"])
        del update, stacked_grads
        alpha = -_adjust_lr(lr, group["adjust_lr_fn"], params[0].shape)
        if skip is None:
            torch._foreach_mul_(params, 1 - lr * decay)
            torch._foreach_add_(params, list(ortho.float().unbind(0)), alpha=alpha)  # BF16 to FP32 is exact
        else:
            old = torch.stack(params)
            new = old.mul(1 - lr * decay).add_(ortho, alpha=alpha)
            torch.where(skip, old, new, out=new)
            torch.where(skip, stacked_bufs, new_bufs, out=new_bufs)
            torch._foreach_copy_(params, list(new.unbind(0)))
        torch._foreach_copy_(bufs, list(new_bufs.unbind(0)))


class MuonAdamW:
    """``BatchedMuon`` and torch.optim.AdamW seen as one optimizer: param_groups (Muon's first), step,
    zero_grad and one state_dict holding both.

    ``found_inf`` (a 0-dim FP32 device tensor, set by the engine's FiniteGuard) makes a step change nothing
    without a host read: fused AdamW skips itself, as under GradScaler, and Muon keeps its old weights and
    buffers (``BatchedMuon``)."""

    def __init__(self, muon: BatchedMuon, adamw: torch.optim.AdamW) -> None:
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
        self.muon.found_inf = self.found_inf
        self.muon.step()
        if self.found_inf is not None:
            # torch's fused Adam/AdamW read the attribute in step() (getattr, as GradScaler sets it).
            setattr(self.adamw, "found_inf", self.found_inf)  # noqa: B010
        self.adamw.step()

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError("not a Muon+AdamW optimizer state (a checkpoint of an AdamW run?)")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def set_lr(optimizer: torch.optim.Optimizer | MuonAdamW, lr: float) -> None:
    """The schedule's lr on every group, times the group's ``lr_scale`` where it has one (Muon's group:
    muon.lr / lr, so each part keeps its own peak; AdamW's groups get ``lr`` itself)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
