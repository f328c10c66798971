"""PackedEngine: the runtime's Engine contract for N decentralized workers in one process."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tiny_llm.budget import parameter_count, step_lrs
from tiny_llm.config import RecipeConfig
from tiny_llm.packed.mixing import ConsensusSchedule, consensus_schedule, mix_, peer_offset
from tiny_llm.packed.model import PackedLlama, local_losses
from tiny_llm.packed.muon import PackedMuon
from tiny_llm.packed.optim import PackedAdamW, clip_per_worker_, clip_rows_, needs_clipping, worker_norms
from tiny_llm.runtime.device import (
    compile_loss,
    compute_context,
    dispatched_attention_kernels,
    uses_fused_optimizer,
    uses_reference_attention,
)
from tiny_llm.runtime.engine import FiniteGuard, NonFiniteError, StepStats, build_model, write_safetensors

# Parameter views into an arena are strided; autograd warns about it but accumulates in place correctly.
_LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"

STATE_VERSION = 1

PackedOptimizer = PackedAdamW | PackedMuon


def build_consensus(recipe: RecipeConfig) -> ConsensusSchedule | None:
    ac = recipe.decentralized.adaptive_consensus if recipe.decentralized else None
    if ac is None:
        return None
    return consensus_schedule(ac.start_frac, ac.p, step_lrs(recipe))


def build_packed_optimizer(model: PackedLlama, recipe: RecipeConfig, device: torch.device) -> PackedOptimizer:
    """PackedAdamW over the whole arena, or PackedMuon (hidden matrices) with PackedAdamW (the rest)."""
    fused = uses_fused_optimizer(recipe, device)
    if recipe.optimizer.name == "muon":
        return PackedMuon(model.arena, model.grad_arena, model.layout, recipe.optimizer, fused=fused)
    return PackedAdamW(
        model.arena, model.grad_arena, model.layout.decay_mask(device), recipe.optimizer, fused=fused
    )


def split_workers(blocks: torch.Tensor, num_models: int) -> torch.Tensor:
    """[n, L+1] global batch -> [N, n/N, L+1]: worker i gets samples i, i+N, i+2N, ..."""
    n = blocks.shape[0]
    if n % num_models:
        raise ValueError(f"a packed update needs a multiple of {num_models} blocks, got {n}")
    return blocks.view(n // num_models, num_models, -1).transpose(0, 1)


class PackedEngine:
    """N workers from the ordinary model's seeded init; per-worker clipping and AdamW (or Muon with AdamW);
    AWC or ATC mixing.

    ``mix=False`` skips mixing, which trains N independent models (used to check the packed
    execution against ordinary models).
    """

    def __init__(self, recipe: RecipeConfig, device: torch.device, *, mix: bool = True) -> None:
        dec = recipe.decentralized
        if dec is None:
            raise ValueError("PackedEngine needs a recipe with a decentralized section")
        self.recipe, self.device, self.mix = recipe, device, mix
        self.num_models, self.topology, self.scheme = dec.num_models, dec.topology, dec.scheme
        self.grad_clip = recipe.optimizer.grad_clip
        self.average = build_model(recipe, torch.device("cpu"))  # seeded: same init as an ordinary run
        muon = recipe.optimizer.name == "muon"
        self.model = PackedLlama(
            self.average,
            self.num_models,
            device,
            reference_attention=uses_reference_attention(recipe),
            muon_layout=muon,
        )
        self.average.to(device)
        self.optimizer = build_packed_optimizer(self.model, recipe, device)
        # As the ordinary engine: with the fused optimizer the finite check needs no host read per update.
        # A device guard skips the first non-finite update's mixing and step, and every later one's, and
        # check_finite() names that update. The unfused path keeps its one read per update and its bits.
        self.guard: FiniteGuard | None = None
        if self.optimizer.fused:
            self.guard = FiniteGuard(device, 2 * self.num_models)
            self.optimizer.found_inf = self.guard.found_inf
        self.consensus = build_consensus(recipe)
        self._scratch = torch.empty_like(self.model.arena)
        self.micro_batch_size = recipe.training.micro_batch_size
        self._compiled_loss = compile_loss(self._loss, recipe)

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return local_losses(self.model, inputs, targets)

    # ------------------------------------------------------------------ one update, in parts

    def forward_backward(self, blocks: torch.Tensor) -> torch.Tensor:
        """Gradients of sum_i (worker i's mean CE) into the gradient arena; return the N local losses."""
        workers = split_workers(blocks.to(self.device, non_blocking=True), self.num_models)
        self.model.grad_arena.zero_()
        # Full updates run compiled (the forced SDPA kernel inside the compiled function, see compile_loss);
        # a short epoch-ending one runs eagerly instead of recompiling.
        loss_fn = self._compiled_loss if workers.shape[1] == self.micro_batch_size else self._loss
        return self._backward(loss_fn, workers)

    def _backward(self, loss_fn: Callable[..., torch.Tensor], workers: torch.Tensor) -> torch.Tensor:
        with compute_context(self.recipe, self.device):
            local = loss_fn(workers[..., :-1], workers[..., 1:])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_LAYOUT_WARNING)
            local.sum().backward()
        return local.detach()

    def clip(self) -> torch.Tensor:
        return clip_per_worker_(self.model.grad_arena, self.grad_clip)

    def gamma(self, lr: float, update: int) -> float:
        if not self.mix:
            return 0.0
        return 1.0 if self.consensus is None else self.consensus.gamma(update, lr)

    def mix_params(self, update: int, gamma: float) -> None:
        """Mix the parameter arena with the topology's matrix of 0-based update ``update`` (not after a
        non-finite update, on the device guard's word)."""
        keep = None if self.guard is None else self.guard.found_inf
        mix_(self.model.arena, self.topology, update, gamma, self._scratch, keep)

    def apply_update(self, lr: float, update: int, gamma: float) -> None:
        """Mixing and the AdamW step, in the scheme's order, from the (clipped) gradient arena."""
        if self.scheme == "awc":  # mix, then step with the gradients of the pre-mix parameters
            self.mix_params(update, gamma)
            self.optimizer.step(lr)
        else:  # atc: adapt, then combine
            self.optimizer.step(lr)
            self.mix_params(update, gamma)

    def train_step(self, blocks: torch.Tensor, lr: float, step: int) -> StepStats:
        """One update; ``step`` is its 1-based number (the trainer's convention), so peers and adaptive
        consensus use the 0-based update index step - 1."""
        update = step - 1
        local = self.forward_backward(blocks)
        norms = worker_norms(self.model.grad_arena)
        values = torch.cat([local.float(), norms])
        if self.guard is None:
            local_list, norm_list = self._check_now(values, step)
            # Skip a pass over the arena when no worker clips.
            if self.grad_clip is not None and needs_clipping(norm_list, self.grad_clip):
                clip_rows_(self.model.grad_arena, norms, self.grad_clip)
        else:
            self.guard.flag(values, step)
            if self.grad_clip is not None:  # on the device: a coefficient of 1 leaves a row's bits as is
                clip_rows_(self.model.grad_arena, norms, self.grad_clip)
        gamma = self.gamma(lr, update)
        self.apply_update(lr, update, gamma)
        tokens = blocks.shape[0] * (blocks.shape[1] - 1)
        # Deferred: slices of the copy ``values`` (under CUDA graphs ``local`` is memory a replay reuses).
        extra = {
            "local_losses": local_list if self.guard is None else values[: self.num_models],
            "local_grad_norms": norm_list if self.guard is None else values[self.num_models :],
            "update_tokens_per_model": tokens // self.num_models,
            "mixing_gamma": gamma,
            **self.mixing_facts(update, gamma),
        }
        # The logged loss is the workers' mean, the norm their max, as the reference logs them (each worker's
        # own values are in extra). The FP64 mean of the FP32 values is the host's sum / N to FP64 rounding.
        if self.guard is None:
            loss, grad_norm = sum(local_list) / len(local_list), max(norm_list)
            return StepStats(loss=loss, grad_norm=grad_norm, tokens=tokens, extra=extra)
        summary = torch.stack([values[: self.num_models].double().mean(), norms.double().max()])
        return StepStats.deferred(summary, tokens, extra)

    def _check_now(self, values: torch.Tensor, step: int) -> tuple[list[float], list[float]]:
        """The workers' (losses, norms), read at once (one device sync); NonFiniteError before stepping."""
        read = values.tolist()
        local_list, norm_list = read[: self.num_models], read[self.num_models :]
        if not all(math.isfinite(v) for v in read):
            self.model.grad_arena.zero_()
            raise NonFiniteError(step, self._reason(local_list, norm_list))
        return local_list, norm_list

    @staticmethod
    def _reason(local_list: list[float], norm_list: list[float]) -> str:
        what = "loss" if not all(map(math.isfinite, local_list)) else "gradient norm"
        return f"non-finite {what} (local losses {local_list}, norms {norm_list})"

    def check_finite(self) -> None:
        """NonFiniteError for the first update skipped as non-finite (one device read); no-op otherwise."""
        bad = None if self.guard is None else self.guard.first_bad()
        if bad is not None:
            step, values = bad
            raise NonFiniteError(step, self._reason(values[: self.num_models], values[self.num_models :]))

    def mixing_facts(self, update: int, gamma: float) -> dict[str, Any]:
        """What the mixing of 0-based update ``update`` did, for the train rows.

        mixing_step: the update whose matrix W_t was applied (None when nothing was mixed: gamma 0);
        mixing_peer_offset: worker i averaged with worker (i - offset) mod N (None for complete mixing);
        consensus_active: adaptive consensus sets gamma from this update on (start_frac reached).
        """
        mixed = gamma > 0.0
        one_peer = mixed and self.topology != "complete"
        return {
            "mixing_step": update if mixed else None,
            "mixing_peer_offset": peer_offset(self.topology, self.num_models, update) if one_peer else None,
            "consensus_active": self.consensus is not None and update >= self.consensus.start_step,
        }

    # ------------------------------------------------------------------ what the run records

    def attention_kernels(self) -> list[str]:
        """The attention operators the update dispatches, for environment.json: one profiled eager
        forward+backward of the training loss on one block per worker, under the update's compute context
        (as the trainer probes an ordinary model); the gradients are discarded.

        Eager, so the probe compiles nothing and compile time stays in the first update's window. A
        compiled update selects its SDPA kernel the same way (a forced one is entered inside the compiled
        function); where inductor generates the attention itself (on the CPU, from the math
        decomposition) no SDPA operator runs at all.
        """
        length = self.recipe.model.context_length
        workers = torch.zeros(self.num_models, 1, length + 1, dtype=torch.long, device=self.device)
        kernels = dispatched_attention_kernels(lambda: self._backward(self._loss, workers))
        self.model.grad_arena.zero_()
        return kernels

    def row_fields(self, stats: StepStats, tokens: int) -> dict[str, Any]:
        """The last update's workers and mixing (``stats.extra``), then the cumulative tokens per model;
        ``tokens`` is the run's so far over all workers."""
        return {**stats.extra, "tokens_per_model": tokens // self.num_models}

    def replay_peak_bytes(self) -> int:
        """No captured update (runtime.cuda_graph is refused for packed runs): no floor."""
        return 0

    def result_fields(self, tokens: int) -> dict[str, Any]:
        """The packed run's facts for result.json; ``tokens`` is the run's total over all workers."""
        return {
            "num_models": self.num_models,
            "total_parameters": self.num_models * parameter_count(self.recipe.model),
            "tokens_per_model": tokens // self.num_models,
            "topology": self.topology,
            "scheme": self.scheme,
        }

    # ------------------------------------------------------------------ evaluation and state

    def eval_model(self) -> nn.Module:
        """An ordinary Llama holding the FP32 average of the workers."""
        self.model.copy_average_to(self.average)
        return self.average

    def state_dict(self) -> dict:
        return {
            "packed_version": STATE_VERSION,
            "num_models": self.num_models,
            "layout": self.model.layout.metadata(),
            "arena": self.model.arena.detach().cpu(),  # saved at once; a GPU run copies it to the host
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("packed_version") != STATE_VERSION or state.get("num_models") != self.num_models:
            raise ValueError("checkpoint is not a packed state for this number of models")
        if state["layout"] != self.model.layout.metadata():
            raise ValueError("checkpoint's packed parameter layout differs from this model's")
        with torch.no_grad():
            self.model.arena.copy_(state["arena"])
        self.optimizer.load_state_dict(state["optimizer"])

    def export_weights(self, path: Path) -> None:
        """Averaged weights at ``path``; worker i's weights at ``<dir>/node-iii/<name>``."""
        path = Path(path)
        write_safetensors(path, self.eval_model().state_dict())
        for worker in range(self.num_models):
            target = path.parent / f"node-{worker:03d}" / path.name
            write_safetensors(target, self.model.worker_state_dict(worker))
