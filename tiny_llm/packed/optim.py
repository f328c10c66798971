"""Per-worker clipping and AdamW over whole arenas (no per-worker or per-parameter loops)."""

from __future__ import annotations

import math

import torch

from tiny_llm.config import OptimizerConfig


@torch.no_grad()
def worker_norms(grads: torch.Tensor) -> torch.Tensor:
    """L2 norm of each row of ``grads`` [N, D] (fp32); padding entries are zero and do not count.

    Two levels (64-element chunks, then rows): one flat fp32 reduction over millions of entries
    drifts by up to 1e-3 relative on CPU; rows are multiples of 64 by construction.
    """
    n = grads.shape[0]
    chunks = grads.view(n, -1, 64) if grads.shape[1] % 64 == 0 else grads.view(n, 1, -1)
    return torch.linalg.vector_norm(torch.linalg.vector_norm(chunks, dim=2, dtype=torch.float32), dim=1)


@torch.no_grad()
def clip_rows_(grads: torch.Tensor, norms: torch.Tensor, max_norm: float) -> None:
    """Scale row i by min(1, max_norm / (norm_i + 1e-6)), the rule of torch.nn.utils.clip_grad_norm_."""
    coef = (max_norm / (norms + 1e-6)).clamp_(max=1.0)
    grads.mul_(coef.to(grads.dtype).unsqueeze(1))


def needs_clipping(norms: list[float], max_norm: float | None) -> bool:
    """False when every coefficient would be exactly 1 (scaling would change nothing)."""
    return max_norm is not None and any(not norm + 1e-6 <= max_norm for norm in norms)


@torch.no_grad()
def clip_per_worker_(grads: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    """Clip each row of ``grads`` [N, D] to L2 norm ``max_norm``; return the N pre-clip norms (fp32)."""
    norms = worker_norms(grads)
    if max_norm is not None:
        clip_rows_(grads, norms, max_norm)
    return norms


def _adamw_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    decay: torch.Tensor,
    lr: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
) -> None:
    """torch.optim.AdamW's single-tensor update, applied to whole [N, D] arenas at once."""
    if weight_decay:
        # where(): the factor rounds exactly as torch's scalar 1 - lr*wd does
        param.mul_(torch.where(decay, 1.0 - lr * weight_decay, 1.0).to(param.dtype))
    exp_avg.lerp_(grad, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    step_size = lr / (1.0 - beta1**step)
    denom = (exp_avg_sq.sqrt() / math.sqrt(1.0 - beta2**step)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


def _fused_adamw_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    decay: torch.Tensor,
    lr: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: torch.Tensor,
    found_inf: torch.Tensor | None = None,
) -> None:
    """The same update with PyTorch's fused AdamW kernel (CPU and CUDA): one pass over the arenas.

    The kernel's decay is uniform, so the masked decoupled decay is applied first (as AdamW does). With
    ``found_inf`` 1 nothing changes, step included (the kernel skips itself, as under GradScaler).
    """
    if weight_decay:
        factor = torch.where(decay, 1.0 - lr * weight_decay, 1.0)
        if found_inf is not None:
            factor = torch.where(found_inf > 0, 1.0, factor)
        param.mul_(factor.to(param.dtype))
    step.add_(1)
    torch._fused_adamw_(
        [param], [grad], [exp_avg], [exp_avg_sq], [], [step],
        lr=lr, beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, amsgrad=False, maximize=False,
        found_inf=found_inf,
    )  # fmt: skip
    if found_inf is not None:
        step.sub_(found_inf)


class PackedAdamW:
    """AdamW for N workers whose parameters, gradients and moments are arenas of one layout.

    Moments stay local to each worker (row i only ever sees worker i's gradients).
    ``decay_mask`` [D] is true where weight decay applies (>= 2-D tensors), false elsewhere.
    ``fused`` uses PyTorch's fused AdamW kernel over the whole arena instead of separate tensor ops; its step
    count lives on the device, and a ``found_inf`` tensor set on the optimizer (1: skip) makes a step change
    nothing without a host read.
    """

    def __init__(
        self,
        params: torch.Tensor,
        grads: torch.Tensor,
        decay_mask: torch.Tensor,
        config: OptimizerConfig,
        *,
        fused: bool = False,
    ) -> None:
        self.params, self.grads, self.config, self.fused = params, grads, config, fused
        self.decay_mask = decay_mask.to(device=params.device, dtype=torch.bool)
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)
        self.step_count = 0
        """Steps taken (the unfused path; the fused one counts in ``_step_tensor``)."""
        self._step_tensor = torch.zeros((), dtype=torch.float32, device=params.device)
        self.found_inf: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, lr: float) -> None:
        c = self.config
        if self.fused:
            _fused_adamw_(
                self.params, self.grads, self.exp_avg, self.exp_avg_sq, self.decay_mask,
                lr, c.weight_decay, c.beta1, c.beta2, c.eps, self._step_tensor, self.found_inf,
            )  # fmt: skip
            return
        if self.found_inf is not None:
            raise ValueError("found_inf needs the fused packed AdamW")
        self.step_count += 1
        _adamw_(
            self.params, self.grads, self.exp_avg, self.exp_avg_sq, self.decay_mask,
            lr, c.weight_decay, c.beta1, c.beta2, c.eps, self.step_count,
        )  # fmt: skip

    def steps_taken(self) -> int:
        """Steps applied so far (a device read on the fused path)."""
        return int(self._step_tensor) if self.fused else self.step_count

    def state_dict(self) -> dict:
        return {
            "step": self.steps_taken(),
            "exp_avg": self.exp_avg.cpu(),
            "exp_avg_sq": self.exp_avg_sq.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        for name in ("exp_avg", "exp_avg_sq"):
            if state[name].shape != self.params.shape:
                raise ValueError(f"packed optimizer {name} has shape {tuple(state[name].shape)}")
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count = int(state["step"])
        self._step_tensor.fill_(self.step_count)
