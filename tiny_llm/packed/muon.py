"""Muon over the packed arena: one batched Newton-Schulz chain per matrix shape for all N workers.

Under ``optimizer.name: muon`` the packed layout puts the embedding and norm scales first and the hidden
matrices after them, grouped by shape (``muon_order``). Each shape's k matrices then sit at a fixed stride
in every arena row, so one strided view ``[N, k, out, in]`` covers that shape for all workers: momentum,
Newton-Schulz, decay and the step are a handful of batched ops per shape, never a loop over workers or
parameters. The embedding and norm scales get ``PackedAdamW`` as in an AdamW packed run. Mixing is the
engine's and sees one arena either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch.optim._muon import _adjust_lr  # torch's per-shape LR scale, as the ordinary engine's Muon

from tiny_llm.config import OptimizerConfig
from tiny_llm.packed.layout import ArenaLayout, Entry
from tiny_llm.packed.optim import PackedAdamW
from tiny_llm.runtime.optim import batched_newton_schulz, is_hidden_matrix, muon_settings


def muon_order(named: Sequence[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Parameters in packed-Muon layout order: the rest (embedding, norm scales) as given, then the hidden
    matrices grouped by shape (stable within a shape)."""
    rest = [(n, p) for n, p in named if not is_hidden_matrix(n, p.shape)]
    hidden = [(n, p) for n, p in named if is_hidden_matrix(n, p.shape)]
    shapes = list(dict.fromkeys(tuple(p.shape) for _, p in hidden))
    return rest + sorted(hidden, key=lambda item: shapes.index(tuple(item[1].shape)))


@dataclass(frozen=True)
class ShapeGroup:
    """k hidden matrices of one shape, laid out at a fixed stride from ``start`` in every arena row."""

    shape: tuple[int, int]
    start: int
    stride: int
    count: int

    def view(self, arena: torch.Tensor) -> torch.Tensor:
        """``[N, k, out, in]`` view of the group in an ``[N, width]`` arena (shares storage)."""
        rows, cols = self.shape
        return arena.as_strided(
            (arena.shape[0], self.count, rows, cols),
            (arena.stride(0), self.stride, cols, 1),
            arena.storage_offset() + self.start,
        )


def shape_groups(layout: ArenaLayout) -> tuple[int, list[ShapeGroup]]:
    """Where the hidden matrices start in a ``muon_order`` layout, and their groups by shape."""
    hidden = [e for e in layout.entries if is_hidden_matrix(e.name, e.shape)]
    if not hidden:
        return layout.width, []
    groups: list[ShapeGroup] = []
    runs: list[list[Entry]] = []
    for entry in hidden:
        if runs and runs[-1][0].shape == entry.shape:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    for run in runs:
        stride = run[1].start - run[0].start if len(run) > 1 else run[0].numel
        if any(b.start - a.start != stride for a, b in pairwise(run)):
            raise ValueError(f"hidden matrices of shape {run[0].shape} are not evenly spaced in the arena")
        groups.append(ShapeGroup(tuple(run[0].shape), run[0].start, stride, len(run)))  # type: ignore[arg-type]
    if len({g.shape for g in groups}) != len(groups):
        raise ValueError("the packed layout does not group the hidden matrices by shape (muon_order)")
    return hidden[0].start, groups


class PackedMuon:
    """Muon on the hidden matrices of N workers, AdamW (``PackedAdamW``) on the rest; one ``step(lr)``.

    Momentum buffers are local to each worker ([N, k, out, in] per shape, FP32), as Adam's moments are.
    ``found_inf`` (a 0-dim device tensor; 1: skip) makes a step change nothing without a host read: the
    new weights and buffers are computed and ``torch.where`` keeps the old ones. The fused AdamW kernel
    needs contiguous tensors, so on the fused path the rest's weights and gradients are staged through
    contiguous copies (a column slice of the arena is strided).
    """

    def __init__(
        self,
        params: torch.Tensor,
        grads: torch.Tensor,
        layout: ArenaLayout,
        config: OptimizerConfig,
        *,
        fused: bool = False,
    ) -> None:
        self.params, self.grads, self.fused = params, grads, fused
        self.split, self.groups = shape_groups(layout)
        settings = muon_settings(config)
        self.lr_scale = settings["lr"] / config.lr  # as set_lr: Muon peaks at muon.lr
        self.momentum, self.nesterov = settings["momentum"], settings["nesterov"]
        self.ns_steps, self.weight_decay = settings["ns_steps"], settings["weight_decay"]
        self.adjust_lr_fn = settings["adjust_lr_fn"]
        self.buffers = [torch.zeros(g.view(params).shape, device=params.device) for g in self.groups]
        rest_params, rest_grads = params[:, : self.split], grads[:, : self.split]
        if fused:  # contiguous staging copies (see the class doc)
            rest_params = torch.empty(rest_params.shape, device=params.device).copy_(rest_params)
            rest_grads = torch.empty(rest_grads.shape, device=params.device)
        self.adamw = PackedAdamW(
            rest_params, rest_grads, layout.decay_mask(params.device)[: self.split], config, fused=fused
        )
        self._found_inf: torch.Tensor | None = None

    @property
    def found_inf(self) -> torch.Tensor | None:
        return self._found_inf

    @found_inf.setter
    def found_inf(self, value: torch.Tensor | None) -> None:
        self._found_inf = value
        self.adamw.found_inf = value

    @torch.no_grad()
    def step(self, lr: float) -> None:
        muon_lr = lr * self.lr_scale
        skip = None if self._found_inf is None else self._found_inf > 0
        for group, buffer in zip(self.groups, self.buffers, strict=True):
            self._muon_step(group.view(self.params), group.view(self.grads), buffer, muon_lr, skip)
        if self.fused:
            self.adamw.params.copy_(self.params[:, : self.split])
            self.adamw.grads.copy_(self.grads[:, : self.split])
        self.adamw.step(lr)
        if self.fused:
            self.params[:, : self.split].copy_(self.adamw.params)

    def _muon_step(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        buffer: torch.Tensor,
        lr: float,
        skip: torch.Tensor | None,
    ) -> None:
        """torch's ``_single_tensor_muon`` for every matrix of one shape and every worker at once."""
        new_buffer = buffer.lerp(grad, 1 - self.momentum)
        update = grad.lerp(new_buffer, self.momentum) if self.nesterov else new_buffer
        n, k, rows, cols = param.shape
        ortho = batched_newton_schulz(update.reshape(n * k, rows, cols), self.ns_steps).view(n, k, rows, cols)
        new_param = param.mul(1 - lr * self.weight_decay).add_(
            ortho, alpha=-_adjust_lr(lr, self.adjust_lr_fn, torch.Size((rows, cols)))
        )
        if skip is None:
            buffer.copy_(new_buffer)
            param.copy_(new_param)
        else:
            torch.where(skip, buffer, new_buffer, out=buffer)
            torch.where(skip, param, new_param, out=param)

    def steps_taken(self) -> int:
        return self.adamw.steps_taken()

    def state_dict(self) -> dict:
        return {
            "muon": {
                "shapes": [list(g.shape) for g in self.groups],
                "momentum": [b.cpu() for b in self.buffers],
            },
            "adamw": self.adamw.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError("not a packed Muon+AdamW optimizer state (a checkpoint of an AdamW run?)")
        if state["muon"]["shapes"] != [list(g.shape) for g in self.groups]:
            raise ValueError("packed Muon state holds other matrix shapes than this model's")
        for buffer, saved in zip(self.buffers, state["muon"]["momentum"], strict=True):
            buffer.copy_(saved)
        self.adamw.load_state_dict(state["adamw"])
