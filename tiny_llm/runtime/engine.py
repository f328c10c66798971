"""The engine contract: what the training loop, evaluation and the benchmark workers use of an engine.

An engine performs one optimizer update from a batch of token blocks. The ordinary
engine (``tiny_llm.train.engine.ModelEngine``) and the packed one
(``tiny_llm.packed.engine.PackedEngine``) both implement ``Engine``; which one a recipe
gets is decided by ``tiny_llm.engines.build_engine``.

Three methods add to what a run records: ``attention_kernels()``, the attention operators an update
dispatches (environment.json), ``result_fields(tokens)``, the engine's own result.json fields (the packed
engine: num_models, total_parameters, tokens_per_model, topology, scheme), and ``row_fields(tokens)``, the
engine's cumulative fields of a train row given the run's tokens so far (the packed engine:
tokens_per_model); the ordinary engine adds none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save as safetensors_bytes
from torch import nn

from tiny_llm.config import RecipeConfig
from tiny_llm.io import atomic_write_bytes
from tiny_llm.model import Llama
from tiny_llm.runtime.device import uses_reference_attention


@dataclass
class StepStats:
    loss: float
    """Token-mean cross entropy of the whole update (nats)."""
    grad_norm: float
    """Global L2 gradient norm before clipping."""
    tokens: int
    """Targets in the update."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Engine-specific values (packed: local_losses, ...)."""


class NonFiniteError(Exception):
    """A non-finite loss or gradient norm; the run stops as failed."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(f"step {step}: {reason}")
        self.step = step
        self.reason = reason


class UpdateAborted(Exception):
    """A stop was requested between microbatches; the partial update was discarded."""


class Engine(Protocol):
    def train_step(self, blocks: torch.Tensor, lr: float, step: int) -> StepStats: ...
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

    def row_fields(self, tokens: int) -> dict[str, Any]:
        """The engine's cumulative fields of a train row, given the run's tokens so far."""
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
