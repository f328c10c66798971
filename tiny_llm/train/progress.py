"""A run's position (what a resume restores besides weights and loader) and the records made from it: train
rows, validation rows and result.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tiny_llm.train.evaluate import EvalResult
from tiny_llm.train.metrics import Window


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


def train_row(p: Progress, epoch: int, lr: float, peak: int, elapsed_rate: float) -> dict[str, Any]:
    """The train row of the window ``p.window`` (its values settled, its span closed)."""
    w = p.window
    return {
        "event": "train",
        "step": p.step,
        "epoch": epoch,
        "tokens": p.tokens,
        "loss": w.loss_sum / w.tokens,
        "lr": lr,
        "grad_norm": w.grad_norm_last,
        "grad_norm_window_mean": w.grad_norm_sum / w.updates,
        "tokens_per_second": w.tokens / w.seconds if w.seconds > 0 else 0.0,
        "training_seconds": w.seconds,
        "cumulative_training_seconds": p.training_seconds,
        "elapsed_tokens_per_second": elapsed_rate,
        "peak_memory_bytes": peak,
    }


def validation_row(p: Progress, event: str, epoch: int, result: EvalResult, peak: int) -> dict[str, Any]:
    return {
        "event": event,
        "step": p.step,
        "epoch": epoch,
        "tokens": p.tokens,
        "loss": result.loss,
        "perplexity": result.perplexity,
        "seconds": result.seconds,
        "split": result.split,
        "validation_complete": result.validation_complete,
        "evaluation_tokens": result.tokens,
        "evaluation_peak_memory_bytes": peak,
        "bpb": result.bpb,
        "evaluation_bytes": result.bytes,
    }


def result_record(
    p: Progress, full: EvalResult, parameters: int, identity: str, seconds_this_session: float
) -> dict[str, Any]:
    """result.json (before the engine's own fields). Times and rates add up over every session of the run,
    except ``seconds_this_session`` (from the validation subset's preparation to now, the final full
    validation included)."""
    return {
        "parameters": parameters,
        "tokens": p.tokens,
        "step": p.step,
        "epochs": p.epochs_done,
        "best_subset_loss": p.best_loss,
        "best_epoch": p.best_epoch,
        "final_validation": full.as_dict(),
        "evaluation_tokens_per_second": full.tokens_per_second,
        "seconds_this_session": seconds_this_session,
        "training_seconds": p.training_seconds,
        "training_elapsed_seconds": p.elapsed_seconds,
        "training_tokens_per_second": p.tokens / p.training_seconds if p.training_seconds else None,
        "elapsed_tokens_per_second": p.tokens / p.elapsed_seconds if p.elapsed_seconds else None,
        "peak_memory_bytes": p.peak_memory_bytes,
        "evaluation_peak_memory_bytes": p.evaluation_peak_memory_bytes,
        "recipe_identity": identity,
    }
