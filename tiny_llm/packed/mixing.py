"""Decentralized mixing: topologies, their doubly stochastic matrices, and adaptive consensus."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

TOPOLOGIES = ("complete", "one_peer_ring", "one_peer_exponential")


def peer_offset(topology: str, num_models: int, step: int) -> int:
    """Worker i averages with worker (i - offset) mod N at update ``step`` (0-based).

    Ring: offset +1 on even steps and -1 on odd ones (the direction alternates).
    Exponential: offset 2^(step mod ceil(log2 N)).
    """
    if topology == "one_peer_ring":
        return 1 if step % 2 == 0 else -1
    if topology == "one_peer_exponential":
        rounds = max(1, (num_models - 1).bit_length())  # ceil(log2 N)
        return 1 << (step % rounds)
    raise ValueError(f"topology {topology!r} has no single peer")


def peers(topology: str, num_models: int, step: int) -> list[int]:
    """The peer of every worker at ``step`` (one-peer topologies)."""
    offset = peer_offset(topology, num_models, step)
    return [(i - offset) % num_models for i in range(num_models)]


@torch.no_grad()
def mix_(
    arena: torch.Tensor,
    topology: str,
    step: int,
    gamma: float,
    scratch: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> None:
    """Apply ``W' = gamma W + (1 - gamma) I`` to the rows of ``arena`` [N, D] in place (``scratch`` has its
    shape); row i of W holds worker i's weights over all workers: 1/N each (complete), or 1/2 on itself and
    1/2 on its ``peers`` entry. ``keep``, a device flag, leaves ``arena`` unchanged where it is nonzero
    (a skipped update) without a host read; the mixed values are the same bits either way."""
    if gamma == 0.0:
        return
    if topology == "complete":
        torch.mean(arena, dim=0, keepdim=True, out=scratch[:1])
        if gamma == 1.0:
            _assign(arena, scratch[:1].expand_as(arena), keep)
        elif keep is None:
            arena.mul_(1.0 - gamma).add_(scratch[:1], alpha=gamma)
        else:
            _assign(arena, arena.mul(1.0 - gamma).add_(scratch[:1], alpha=gamma), keep)
        return
    n = arena.shape[0]
    k = peer_offset(topology, n, step) % n
    # scratch[i] = arena[(i - k) mod N]: two slice copies, no index tensor (no host-to-device copy per step)
    scratch[k:].copy_(arena[: n - k])
    scratch[:k].copy_(arena[n - k :])
    # gamma (0.5 I + 0.5 P) + (1 - gamma) I = (1 - gamma/2) I + (gamma/2) P
    arena.mul_(1.0 - 0.5 * gamma).add_(scratch, alpha=0.5 * gamma)
    if (
        keep is not None
    ):  # scratch holds the pre-mix rows shifted by k: put them back (no arena-sized temporary)
        skip = keep > 0
        torch.where(skip, scratch[k:], arena[: n - k], out=arena[: n - k])
        torch.where(skip, scratch[:k], arena[n - k :], out=arena[n - k :])


def _assign(arena: torch.Tensor, mixed: torch.Tensor, keep: torch.Tensor | None) -> None:
    if keep is None:
        arena.copy_(mixed)
    else:
        torch.where(keep > 0, arena, mixed, out=arena)


@torch.no_grad()
def mix_tensor_lists_(
    tensors: Sequence[Sequence[torch.Tensor]], topology: str, step: int, gamma: float
) -> None:
    """The same mixing for N separate models: ``tensors[i]`` is worker i's parameter list.

    Used by the sequential baseline of the packed benchmark.
    """
    n = len(tensors)
    if gamma == 0.0:
        return
    for group in zip(*tensors, strict=True):
        stacked = torch.stack(group)
        if topology == "complete":
            mixed = stacked.mean(dim=0, keepdim=True).expand_as(stacked)
            if gamma != 1.0:
                mixed = stacked * (1.0 - gamma) + mixed * gamma
        else:
            index = torch.tensor(peers(topology, n, step), device=stacked.device)
            mixed = stacked * (1.0 - 0.5 * gamma) + stacked.index_select(0, index) * (0.5 * gamma)
        for target, value in zip(group, mixed, strict=True):
            target.copy_(value)


@dataclass(frozen=True)
class ConsensusSchedule:
    """Adaptive consensus: gamma = (lr_t / lr_max)^p from ``start_step`` on, 1 before."""

    start_step: int
    lr_max: float
    p: float

    def gamma(self, step: int, lr: float) -> float:
        if step < self.start_step or self.lr_max <= 0:
            return 1.0
        return min(1.0, max(0.0, lr / self.lr_max)) ** self.p


def consensus_schedule(start_frac: float, p: float, step_lrs: list[float]) -> ConsensusSchedule:
    """Start at ceil(start_frac x total steps); lr_max is the largest LR over the active steps."""
    total = len(step_lrs)
    start = math.ceil(start_frac * total)
    active = step_lrs[start:]
    return ConsensusSchedule(start_step=start, lr_max=max(active) if active else 0.0, p=p)
