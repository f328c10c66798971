"""What a run records (torch-free): its train rows, validation rows and result.json, the fields of them that
measure time or memory, and the console's line of a train row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tiny_llm.train.progress import Progress

if TYPE_CHECKING:
    from tiny_llm.train.clock import RowFigures
    from tiny_llm.train.evaluate import EvalResult

TIMING_FIELDS = frozenset(
    {
        "tokens_per_second",
        "training_seconds",
        "cumulative_training_seconds",
        "elapsed_tokens_per_second",
        "peak_memory_bytes",
        "evaluation_peak_memory_bytes",
        "seconds",
        "mfu",
        "seconds_this_session",
        "training_elapsed_seconds",
        "training_tokens_per_second",
        "median_tokens_per_second",
        "evaluation_tokens_per_second",
    }
)
"""Fields of metrics rows, result.json and rankings that measure time or memory: no two runs share them, so a
comparison of two runs' records leaves them out."""


def train_row(
    p: Progress,
    epoch: int,
    lr: float,
    clock: RowFigures,
    mfu: tuple[float, float | None],
    engine_fields: Mapping[str, Any],
) -> dict[str, Any]:
    """The train row of the window ``p.window`` (its values settled, its span closed). ``mfu``: (training
    FLOPs per token, the peak FLOP/s of every rank's device, or None where no peak is known: no ``mfu``);
    ``engine_fields``: the engine's own (``Engine.row_fields``), which never replace the row's."""
    w = p.window
    row: dict[str, Any] = {
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
        "elapsed_tokens_per_second": clock.elapsed_tokens_per_second,
        "peak_memory_bytes": clock.peak_memory_bytes,
    }
    flops_per_token, peak_flops = mfu
    if peak_flops:
        row["mfu"] = row["tokens_per_second"] * flops_per_token / peak_flops
    row.update({k: v for k, v in engine_fields.items() if k not in row})
    return row


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


# ----------------------------------------------------------------------------- the console


def format_duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def format_tokens(tokens: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.2f}{unit}"
    return str(int(tokens))


def console_line(row: dict[str, Any], num_epochs: int, num_updates: int, eta_seconds: float) -> str:
    return (
        f"epoch {row['epoch']}/{num_epochs} step {row['step']}/{num_updates} "
        f"tokens {format_tokens(row['tokens'])} loss {row['loss']:.4f} lr {row['lr']:.3e} "
        f"gnorm {row['grad_norm']:.3f} tok/s {row['tokens_per_second']:,.0f} "
        f"ETA {format_duration(eta_seconds)}"
    )
