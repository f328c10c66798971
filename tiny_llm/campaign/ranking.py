"""Ranking finished runs: lower final validation loss first, ties broken by the optimizer settings."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_llm.io import read_json


@dataclass(frozen=True)
class RunOutcome:
    """What ranking needs from one finished run."""

    run_id: str
    loss: float
    """Final full-validation loss (inf when missing or not finite)."""
    lr: float
    weight_decay: float
    beta2: float


def rank_key(outcome: RunOutcome) -> tuple[float, float, float, float, str]:
    """Lower final loss first; ties -> lower lr, then lower weight decay, then lower beta2."""
    return (outcome.loss, outcome.lr, outcome.weight_decay, outcome.beta2, outcome.run_id)


def rank_runs(outcomes: Iterable[RunOutcome]) -> list[RunOutcome]:
    return sorted(outcomes, key=rank_key)


def final_loss(result: Mapping[str, Any]) -> float:
    """result.json's final full-validation loss; inf if absent or not finite, so such runs rank last."""
    loss = (result.get("final_validation") or {}).get("loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        return math.inf
    return float(loss)


def outcome_from(run_id: str, result: Mapping[str, Any], recipe: Mapping[str, Any]) -> RunOutcome:
    opt = recipe["optimizer"]
    return RunOutcome(run_id, final_loss(result), opt["lr"], opt["weight_decay"], opt["beta2"])


def ranking_rows(ranked: Sequence[RunOutcome]) -> list[dict[str, Any]]:
    """JSON rows of a stage ranking (loss null where it was missing)."""
    return [
        {
            "rank": i,
            "run": o.run_id,
            "loss": o.loss if math.isfinite(o.loss) else None,
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "beta2": o.beta2,
        }
        for i, o in enumerate(ranked)
    ]


def diverged_result(run_dir: str | Path, exit_code: int) -> dict[str, Any] | None:
    """The result.json of a run that stopped on a non-finite loss or norm, or None for any other failure.

    A diverged grid point is an outcome of the campaign (it ranks last), not a reason to stop promoting the
    others; crashes, interruptions and user errors are not outcomes and still fail the job.
    """
    status_file = Path(run_dir) / "status.json"
    if exit_code != 1 or not status_file.is_file():
        return None
    status = read_json(status_file)
    if status.get("status") != "failed" or "non-finite" not in str(status.get("error", "")):
        return None
    return {
        "status": "diverged",
        "error": status["error"],
        "step": status.get("step"),
        "tokens": status.get("tokens"),
        "final_validation": None,
    }
