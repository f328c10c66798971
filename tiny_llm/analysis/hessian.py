"""Gradients and Hessian-vector products of a token-mean loss over a fixed set of blocks.

The loss over a set of blocks is sum(CE over every target) / (number of targets); it is evaluated in
microbatches, and each microbatch's share is differentiated on its own and added up, so the result does not
depend on how the blocks are split. The Hessian is used only through products H v (Pearlmutter, by double
backward: the microbatch's gradient is built with a graph, then differentiated along each direction), never
materialised. The directions of one pass share its forward and first backward; each adds one second
backward, which is what makes a product cost about twice a gradient rather than three to four times.

Vectors are flat: one 1-D tensor over every parameter in ``model.parameters()`` order (``FlatParameters``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from torch import nn

from tiny_llm.model import loss_sum

LossFn = Callable[[torch.Tensor], torch.Tensor]
"""A microbatch of blocks [b, L+1] -> its summed loss (a scalar with a graph to the parameters)."""

_RADEMACHER_STREAM = 3


class FlatParameters:
    """Flat vectors <-> per-parameter views, for a fixed list of parameters."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.size = sum(self.numels)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat`` shaped like the parameters."""
        return [t.view(shape) for t, shape in zip(flat.split(self.numels), self.shapes, strict=True)]

    def flatten(self, tensors: Iterable[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in tensors])

    def zeros(self) -> torch.Tensor:
        p = self.params[0]
        return torch.zeros(self.size, dtype=p.dtype, device=p.device)


def model_loss(model: nn.Module, *, amp: bool = False) -> LossFn:
    """Summed FP32 cross entropy of a microbatch of blocks (inputs = the first L tokens, targets the last L);
    ``amp``: under BF16 autocast (the reference attention and the loss stay FP32)."""

    def loss(blocks: torch.Tensor) -> torch.Tensor:
        context = (
            torch.autocast(device_type=blocks.device.type, dtype=torch.bfloat16)
            if amp
            else contextlib.nullcontext()
        )
        with context:
            return loss_sum(model, blocks[:, :-1], blocks[:, 1:])

    return loss


@dataclass
class PassResult:
    loss: float
    """Token-mean loss over the pass's blocks."""
    gradient: torch.Tensor | None = None
    """Flat gradient of that loss (when asked)."""
    quadratics: list[float] = field(default_factory=list)
    """v^T H v for every direction, in order."""
    products: list[torch.Tensor] | None = None
    """H v for every direction (when asked)."""


def curvature_pass(
    loss_fn: LossFn,
    flat: FlatParameters,
    batches: Iterable[torch.Tensor],
    num_targets: int,
    directions: Sequence[torch.Tensor] = (),
    *,
    gradient: bool = False,
    products: bool = False,
) -> PassResult:
    """One pass over ``batches``: the token-mean loss, its gradient and, for every direction v, v^T H v and
    (``products``) H v, where the loss is sum(loss_fn(batch)) / num_targets.

    Per microbatch: forward, gradient (with a graph when there are directions), then for each direction one
    backward of <gradient, v>. Quadratic forms are accumulated in FP64, their dot products included.
    """
    params = flat.params
    views = [flat.split(v.detach()) for v in directions]
    grad_acc = [torch.zeros_like(p) for p in params] if gradient else None
    hv_acc = [[torch.zeros_like(p) for p in params] for _ in directions] if products else None
    device = params[0].device
    quadratics = torch.zeros(len(directions), dtype=torch.float64, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for batch in batches:
        loss = loss_fn(batch) / num_targets
        total += loss.detach().double()
        grads = torch.autograd.grad(loss, params, create_graph=bool(directions))
        if grad_acc is not None:
            torch._foreach_add_(grad_acc, [g.detach() for g in grads])
        for index, v in enumerate(views):
            directional = cast(torch.Tensor, sum(_dot(g, u) for g, u in zip(grads, v, strict=True)))
            hv = torch.autograd.grad(directional, params, retain_graph=index < len(views) - 1)
            quadratics[index] += sum(_dot(h.double(), u.double()) for h, u in zip(hv, v, strict=True))
            if hv_acc is not None:
                torch._foreach_add_(hv_acc[index], list(hv))
        del loss, grads
    values = torch.cat([total.view(1), quadratics]).tolist()  # one device sync per pass
    if not all(math.isfinite(x) for x in values):
        raise FloatingPointError(f"non-finite loss or curvature in a Hessian pass: {values}")
    return PassResult(
        loss=values[0],
        gradient=flat.flatten(grad_acc) if grad_acc is not None else None,
        quadratics=values[1:],
        products=[flat.flatten(h) for h in hv_acc] if hv_acc is not None else None,
    )


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.dot(a.reshape(-1), b.reshape(-1))


def hvp(
    loss_fn: LossFn, flat: FlatParameters, batches: Iterable[torch.Tensor], num_targets: int, v: torch.Tensor
) -> torch.Tensor:
    """H v of the token-mean loss over ``batches`` (a re-iterable of microbatches)."""
    products = curvature_pass(loss_fn, flat, batches, num_targets, [v], products=True).products
    assert products is not None  # asked for
    return products[0]


def gradient(
    loss_fn: LossFn, flat: FlatParameters, batches: Iterable[torch.Tensor], num_targets: int
) -> tuple[torch.Tensor, float]:
    """Flat gradient and value of the token-mean loss over ``batches``: per microbatch a backward of its
    summed loss / ``num_targets`` accumulated, as the training step accumulates its microbatches."""
    result = curvature_pass(loss_fn, flat, batches, num_targets, gradient=True)
    assert result.gradient is not None  # asked for
    return result.gradient, result.loss


def rademacher(size: int, seed: int, index: int, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Direction ``index`` of ``seed``: i.i.d. +-1 entries, drawn on the CPU from a generator of its own
    (so it is the same vector on every device and for every dtype)."""
    generator = torch.Generator()
    generator.manual_seed(int(np.random.SeedSequence([seed, _RADEMACHER_STREAM, index]).generate_state(1)[0]))
    signs = torch.randint(0, 2, (size,), generator=generator, dtype=torch.int8)
    return signs.to(device=device, dtype=dtype).mul_(2).sub_(1)


def norm_squared(v: torch.Tensor) -> float:
    """|v|^2 accumulated in FP64."""
    return float(torch.dot(v.double(), v.double()))
