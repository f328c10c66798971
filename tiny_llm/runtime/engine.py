"""The engine contract: what the training loop, evaluation and the benchmark workers use of an engine.

An engine performs one optimizer update from a batch of token blocks. The ordinary
engine (``tiny_llm.train.engine.ModelEngine``) and the packed one
(``tiny_llm.packed.engine.PackedEngine``) both implement ``Engine``; which one a recipe
gets is decided by ``tiny_llm.engines.build_engine``.

Three methods add to what a run records: ``attention_kernels()``, the attention operators an update
dispatches (environment.json), ``result_fields(tokens)``, the engine's own result.json fields (the packed
engine: num_models, total_parameters, tokens_per_model, topology, scheme), and ``row_fields(stats, tokens)``,
the engine's own fields of a train row: its last update's ``extra`` and the cumulative facts given the run's
tokens so far (the packed engine: local_losses, ..., tokens_per_model); the ordinary engine adds none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save as safetensors_bytes
from torch import nn

from tiny_llm.config import RecipeConfig
from tiny_llm.io import atomic_write_bytes
from tiny_llm.model import Llama
from tiny_llm.runtime.device import uses_reference_attention


class StepStats:
    """What an update reports. ``loss`` (token-mean cross entropy of the whole update, nats) and
    ``grad_norm`` (global L2 norm before clipping) may still be on the device: ``values`` is then the unread
    [loss, grad_norm] pair (None when they are floats already), and reading ``loss`` or ``grad_norm`` waits
    for the device once."""

    def __init__(
        self,
        loss: float | torch.Tensor,
        grad_norm: float | torch.Tensor,
        tokens: int,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.values: torch.Tensor | None = None
        self._read: tuple[float, float] | None = None
        if isinstance(loss, torch.Tensor) or isinstance(grad_norm, torch.Tensor):
            self.values = torch.stack([torch.as_tensor(loss).float(), torch.as_tensor(grad_norm).float()])
        else:
            self._read = (float(loss), float(grad_norm))
        self.tokens = tokens
        """Targets in the update."""
        self._extra = extra if extra is not None else {}

    @classmethod
    def deferred(cls, values: torch.Tensor, tokens: int, extra: dict[str, Any] | None = None) -> StepStats:
        """Stats whose [loss, grad_norm] ``values`` (and tensors among ``extra``) stay on the device until
        read."""
        stats = cls(0.0, 0.0, tokens, extra)
        stats.values, stats._read = values, None
        return stats

    @property
    def extra(self) -> dict[str, Any]:
        """Engine-specific values (packed: local_losses, ...); a tensor among them is read into a list the
        first time (only a logged update's are ever read)."""
        for key, value in self._extra.items():
            if isinstance(value, torch.Tensor):
                self._extra[key] = value.tolist()
        return self._extra

    def read(self) -> tuple[float, float]:
        """(loss, grad_norm) as floats (a device read the first time, for deferred values)."""
        if self._read is None:
            assert self.values is not None
            loss, grad_norm = self.values.tolist()
            self._read = (loss, grad_norm)
        return self._read

    @staticmethod
    def read_all(stats: list[StepStats]) -> None:
        """Read the deferred values of many updates with one device transfer."""
        unread = [s for s in stats if s._read is None]
        if unread:
            values = torch.stack([s.values for s in unread]).tolist()  # type: ignore[misc]
            for s, (loss, grad_norm) in zip(unread, values, strict=True):
                s._read = (loss, grad_norm)

    @property
    def loss(self) -> float:
        return self.read()[0]

    @property
    def grad_norm(self) -> float:
        return self.read()[1]


class NonFiniteError(Exception):
    """A non-finite loss or gradient norm; the run stops as failed."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"step {step}: {reason}")
        self.step = step
        self.reason = reason


class FiniteGuard:
    """The finite check of an update without a host read: on the device, the first non-finite update's step
    and values are kept and ``found_inf`` becomes 1 for good, so that update and every later one are
    skipped on the device (an optimizer that takes ``found_inf``, as GradScaler uses it); ``first_bad()``
    reads them once, at a train row or before a save."""

    def __init__(self, device: torch.device, num_values: int) -> None:
        # FP32 whatever torch.get_default_dtype() is: the fused Adam/AdamW CUDA kernels take only an FP32
        # found_inf, and the values flagged are FP32 losses and norms.
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=device)  # -1: none yet
        self.bad_values = torch.zeros(num_values, dtype=torch.float32, device=device)

    def flag(self, values: torch.Tensor, step: int | torch.Tensor) -> None:
        """Remember ``step`` (a device tensor in a captured update) and ``values`` if they are the first
        non-finite ones; raise found_inf then."""
        first = (self.first_bad_step < 0) & ~torch.isfinite(values).all()
        self.first_bad_step.copy_(torch.where(first, step, self.first_bad_step))
        self.bad_values.copy_(torch.where(first, values, self.bad_values))
        self.found_inf.copy_((self.first_bad_step >= 0).float())

    def first_bad(self) -> tuple[int, list[float]] | None:
        """(step, values) of the first skipped update (one device read), None when every update was finite."""
        step = int(self.first_bad_step)
        return None if step < 0 else (step, self.bad_values.tolist())


class UpdateAborted(Exception):
    """A stop was requested between microbatches; the partial update was discarded."""


class Engine(Protocol):
    def train_step(self, blocks: torch.Tensor, lr: float, step: int) -> StepStats: ...
    def check_finite(self) -> None:
        """``NonFiniteError`` for the first update skipped as non-finite on the device (an engine that reads
        every update's values raises in ``train_step`` instead, and this is a no-op); the loop calls it
        before it reads a window's values, writes a row or saves state."""
        ...

    def eval_model(self) -> nn.Module: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...
    def export_weights(self, path: Path) -> None: ...
    def attention_kernels(self) -> list[str]:
        """The attention operators an update dispatches, from one profiled eager forward+backward whose
        gradients are discarded."""
        ...

    def result_fields(self, tokens: int) -> dict[str, Any]:
        """The engine's own result.json fields, given the run's tokens."""
        ...

    def row_fields(self, stats: StepStats, tokens: int) -> dict[str, Any]:
        """The engine's own fields of a train row: its last update's ``stats.extra``, then the cumulative
        facts given the run's tokens so far."""
        ...

    def replay_peak_bytes(self) -> int:
        """The floor of a window's peak memory: for updates that replay captured CUDA graphs, the capture's
        peak, which a replay never moves in the allocator's statistics (the run's clock and the benchmark
        worker take it as a floor); 0 for any other engine."""
        ...


EngineFactory = Callable[[RecipeConfig, torch.device], Engine]
"""recipe, device -> a fresh engine (``tiny_llm.engines.build_engine``)."""


def build_model(recipe: RecipeConfig, device: torch.device) -> Llama:
    """The seeded initial model; built on the CPU first so every device starts from the same weights."""
    torch.manual_seed(recipe.runtime.seed)
    model = Llama(recipe.model, reference_attention=uses_reference_attention(recipe))
    return model.to(device)


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Weights as a .safetensors file (host copies, contiguous), written atomically."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata={"format": "pt"}))
