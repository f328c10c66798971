"""A run's position: what a resume restores besides weights and loader (torch-free)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Window:
    """Accumulators between two train rows (persisted in the state so resumed rows match)."""

    loss_sum: float = 0.0
    tokens: int = 0
    seconds: float = 0.0
    grad_norm_sum: float = 0.0
    updates: int = 0
    grad_norm_last: float = 0.0
    """The window's last update's norm: a train row's grad_norm, as the reference logs it."""

    def add(self, loss: float, tokens: int, grad_norm: float) -> None:
        """One update's figures; its time comes with its span's (``RunClock``)."""
        self.loss_sum += loss * tokens
        self.tokens += tokens
        self.grad_norm_sum += grad_norm
        self.grad_norm_last = grad_norm
        self.updates += 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Progress:
    """Everything about the run's position that a resume must restore (besides weights and loader)."""

    step: int = 0
    blocks: int = 0
    tokens: int = 0
    epochs_done: int = 0
    pending_epoch: int | None = None
    """Epoch whose end-of-epoch validation has not run yet (an interruption during validation)."""
    best_epoch: int | None = None
    best_loss: float | None = None
    best_weights: str | None = None
    training_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    """Wall time from the first update to the last saved state (or the final state), summed over every
    session of the run: it includes subset validation and checkpoint writes, not the final full
    validation nor start-up before a session's first update."""
    peak_memory_bytes: int | None = None
    """Training peak (the highest train row's); evaluation is measured apart."""
    evaluation_peak_memory_bytes: int | None = None
    window: Window = field(default_factory=Window)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        return cls(**{**data, "window": Window(**data["window"])})
