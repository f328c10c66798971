"""The ordinary engine: one Llama model's optimizer update from a batch of token blocks.

It implements the runtime's ``Engine`` contract (``tiny_llm.runtime.engine``), as the
packed engine does; ``tiny_llm.engines.build_engine`` picks one of the two for a recipe.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function

from tiny_llm.config import RecipeConfig
from tiny_llm.model import loss_sum
from tiny_llm.runtime import signals
from tiny_llm.runtime.device import (
    compile_loss,
    compiles_cuda_graphs,
    compute_context,
    dispatched_attention_kernels,
    peak_memory_bytes,
    sdpa_context,
    to_device,
    uses_compile,
    uses_fused_optimizer,
)
from tiny_llm.runtime.engine import (
    FiniteGuard,
    NonFiniteError,
    StepStats,
    UpdateAborted,
    build_model,
    write_safetensors,
)
from tiny_llm.runtime.optim import build_optimizer, set_lr

GRAPH_RECORDING_UPDATES = 3
"""Updates over which compiled CUDA graphs are warmed up and recorded (torch's graph trees record a function
at its second call; a microbatch's forward and backward are separate functions)."""


def non_finite_reason(loss: float, grad_norm: float) -> str:
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    return f"non-finite {what} (loss {loss}, grad_norm {grad_norm})"


class ModelEngine:
    """One Llama model, FP32 master weights, AdamW (or Muon with AdamW), gradient accumulation over
    microbatches."""

    def __init__(self, recipe: RecipeConfig, device: torch.device) -> None:
        self.recipe = recipe
        self.device = device
        self.micro_batch_size = recipe.training.micro_batch_size
        self.grad_clip = recipe.optimizer.grad_clip
        self.model = build_model(recipe, device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        # Gradients live in tensors allocated once and zeroed in place, never set to None. Under CUDA
        # graphs (compile_mode reduce-overhead / max-autotune) a microbatch's gradients come out in
        # graph-owned memory that the next replay overwrites: with .grad None autograd would adopt that
        # memory as .grad and the next microbatch would overwrite it; with .grad allocated it adds it in.
        self.grads = [torch.zeros_like(p) for p in self.params]
        self.optimizer = build_optimizer(
            self.model, recipe.optimizer, fused=uses_fused_optimizer(recipe, device)
        )
        self.compiled = uses_compile(recipe)
        self._compiled_loss = compile_loss(self._loss, recipe)
        # Fused AdamW skips its step on the device when found_inf is 1 (as GradScaler uses it), so the
        # finite check needs no host read per update: the flag stays 1 from the first non-finite update on,
        # every later update of the window is skipped too, and check_finite() names that update's step.
        # The unfused (deterministic) path keeps its one read per update, and its bitwise results.
        self.deferred_check = uses_fused_optimizer(recipe, device)
        if self.deferred_check:
            self.guard = FiniteGuard(device, 2)
            # torch's fused Adam/AdamW read the attribute in step() (getattr, as GradScaler sets it).
            setattr(self.optimizer, "found_inf", self.guard.found_inf)  # noqa: B010
        # compile_mode reduce-overhead / max-autotune record CUDA graphs in the first updates and replay them
        # from a private pool: the allocator's peak of a window that only replays misses that memory. The
        # peak of the recording updates is the floor (``replay_peak_bytes``), as the captured update's is.
        self.recording_updates_left = GRAPH_RECORDING_UPDATES if compiles_cuda_graphs(recipe, device) else 0
        self.recorded_peak_bytes = 0

    def _loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # A forced SDPA kernel is entered inside the compiled region: compiled graphs ignore an outer one.
        with sdpa_context(self.recipe):
            return loss_sum(self.model, inputs, targets)

    def zero_grads(self) -> None:
        """Zero the persistent gradients in place, re-attaching any that other code set to None."""
        for param, grad in zip(self.params, self.grads, strict=True):
            if param.grad is not grad:
                param.grad = grad
        torch._foreach_zero_(self.grads)

    def forward_backward(
        self, blocks: torch.Tensor, num_targets: int, *, abortable: bool = True
    ) -> torch.Tensor:
        """Zero the gradients, accumulate those of summed CE / num_targets; return the summed CE.
        ``abortable``: a stop request between microbatches discards the update (UpdateAborted)."""
        self.zero_grads()
        total = torch.zeros((), device=self.device)
        for index, micro in enumerate(blocks.split(self.micro_batch_size)):
            if abortable and index and signals.stop_requested():
                self.zero_grads()
                raise UpdateAborted()
            summed = self.microbatch_loss(micro)
            total += summed.detach()  # read graph-owned outputs before the next replay reuses them
            with record_function("backward"):
                (summed / num_targets).backward()
        return total

    def microbatch_loss(self, micro: torch.Tensor) -> torch.Tensor:
        """One microbatch's summed CE, with its graph for backward. Full microbatches run compiled; a
        short one runs eagerly instead of recompiling."""
        loss_fn = self._compiled_loss if micro.shape[0] == self.micro_batch_size else self._loss
        with record_function("forward_and_loss"), compute_context(self.recipe, self.device):
            return loss_fn(micro[:, :-1], micro[:, 1:])

    def train_step(self, blocks: torch.Tensor, lr: float, step: int) -> StepStats:
        # Named regions cost nothing without a profiler; with one (benchmark-worker --profile) they split
        # the production update into data / forward_and_loss / backward / clipping / optimizer.
        num_targets = blocks.shape[0] * (blocks.shape[1] - 1)
        with record_function("data"):
            blocks = to_device(blocks, self.device)
        total = self.forward_backward(blocks, num_targets)
        with record_function("clipping"):
            norm_t, values = self.norm_and_values(total, num_targets)
            if self.deferred_check:
                self.guard.flag(values, step)
            else:
                loss, grad_norm = self._check_now(values, step)
            self.clip(norm_t)
        with record_function("optimizer"):
            set_lr(self.optimizer, lr)
            self.optimizer.step()
        if self.recording_updates_left:  # the allocator's host-side statistics: no device wait
            self.recording_updates_left -= 1
            self.recorded_peak_bytes = max(self.recorded_peak_bytes, peak_memory_bytes(self.device))
        if self.deferred_check:
            return StepStats.deferred(values, num_targets)
        return StepStats(loss=loss, grad_norm=grad_norm, tokens=num_targets)

    def replay_peak_bytes(self) -> int:
        """The floor of a window's peak memory: under compiled CUDA graphs, the peak of the updates that
        recorded them (their pool stays allocated, and replays never move the allocator's peak); else 0."""
        return self.recorded_peak_bytes

    def norm_and_values(self, total: torch.Tensor, num_targets: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients' global L2 norm, and the update's [loss, grad_norm] (both on the device)."""
        norm_t = torch.nn.utils.get_total_norm(self.grads, foreach=self.device.type == "cuda")
        return norm_t, torch.stack([total / num_targets, norm_t.float()])

    def clip(self, norm_t: torch.Tensor) -> None:
        """Scale the gradients to optimizer.grad_clip given their norm (no host read); no-op when null."""
        if self.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm_t)

    def _check_now(self, values: torch.Tensor, step: int) -> tuple[float, float]:
        """The update's (loss, norm), read at once (one device sync); NonFiniteError before stepping."""
        loss, grad_norm = values.tolist()
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.zero_grads()
            raise NonFiniteError(step, non_finite_reason(loss, grad_norm))
        return loss, grad_norm

    def check_finite(self) -> None:
        """NonFiniteError for the first update skipped as non-finite (one device read); no-op otherwise."""
        bad = self.guard.first_bad() if self.deferred_check else None
        if bad is not None:
            raise NonFiniteError(bad[0], non_finite_reason(*bad[1]))

    def eval_model(self) -> nn.Module:
        return self.model

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def export_weights(self, path: Path) -> None:
        write_safetensors(path, self.model.state_dict())

    def attention_kernels(self) -> list[str]:
        """One profiled eager forward+backward on a single block; the gradients are discarded."""
        length = self.recipe.model.context_length
        block = torch.zeros(1, length + 1, dtype=torch.long, device=self.device)

        def run() -> None:
            with compute_context(self.recipe, self.device):
                loss_sum(self.model, block[:, :-1], block[:, 1:]).backward()

        kernels = dispatched_attention_kernels(run)
        self.model.zero_grad(set_to_none=False)  # in place: the engine keeps its gradient tensors
        return kernels

    def result_fields(self, tokens: int) -> dict[str, Any]:
        """An ordinary run has no fields of its own."""
        return {}

    def row_fields(self, stats: StepStats, tokens: int) -> dict[str, Any]:
        """Nor has its train row."""
        return {}
