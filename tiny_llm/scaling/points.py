"""The runs a scaling fit reads, as points: runs of one (N, D) are the seeds of one point.

A run directory gives its model (``resolved.yaml``: N, the non-embedding parameters), its training tokens D
and final full-validation loss (``result.json``: ``tokens``, ``final_validation.loss`` and, when the
evaluation measured it, ``final_validation.bpb``), its horizon (``training.tokens_per_parameter``) and its
measured throughput (``training_tokens_per_second``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiny_llm.budget import non_embedding_parameter_count
from tiny_llm.config import ModelConfig
from tiny_llm.errors import REBUILD_RESULT, ConfigError, DataError
from tiny_llm.io import read_json_mapping, read_yaml
from tiny_llm.typed import typed_from_dict

METRICS = ("loss", "bpb")
"""What a fit can be of: the final full-validation loss (nats per token) and bits per byte."""


@dataclass(frozen=True)
class Run:
    path: str
    """The run directory."""
    n: int
    """Non-embedding parameters."""
    parameters: int
    d: int
    """Training tokens (targets)."""
    tokens_per_parameter: float
    seed: int
    loss: float | None
    """None: the run stopped without a final validation (it diverged); the fit leaves it out."""
    bpb: float | None
    tokens_per_second: float | None

    def value(self, metric: str) -> float | None:
        return self.loss if metric == "loss" else self.bpb

    def sources(self) -> list[str]:
        return [str(Path(self.path) / "resolved.yaml"), str(Path(self.path) / "result.json")]


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def read_run(run_dir: str | Path) -> Run:
    """One finished run; a missing or damaged file is one line naming it."""
    run_dir = Path(run_dir)
    result = read_json_mapping(run_dir / "result.json", REBUILD_RESULT)
    recipe = read_yaml(run_dir / "resolved.yaml", REBUILD_RESULT)
    try:
        model = typed_from_dict(ModelConfig, recipe["model"], "model")
        horizon = float(recipe["training"]["tokens_per_parameter"])
        seed = int(recipe["runtime"]["seed"])
        tokens, parameters = int(result["tokens"]), int(result["parameters"])
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{run_dir}: not a finished training run ({exc}); {REBUILD_RESULT}") from None
    final = result.get("final_validation") or {}
    return Run(
        path=str(run_dir),
        n=non_embedding_parameter_count(model),
        parameters=parameters,
        d=tokens,
        tokens_per_parameter=horizon,
        seed=seed,
        loss=_finite(final.get("loss")),
        bpb=_finite(final.get("bpb")),
        tokens_per_second=_finite(result.get("training_tokens_per_second")),
    )


@dataclass(frozen=True)
class Point:
    """The runs of one (N, D): one configuration's seeds."""

    n: int
    d: int
    tokens_per_parameter: float
    runs: tuple[Run, ...]

    def values(self, metric: str) -> np.ndarray:
        return np.array([run.value(metric) for run in self.runs], dtype=float)

    @property
    def compute(self) -> float:
        """C ≈ 6·N·D."""
        return 6.0 * self.n * self.d


def group_points(runs: list[Run]) -> list[Point]:
    """Runs that finished, grouped by (N, D), ordered by N then D; a run of the same (N, D) but another
    horizon label cannot happen (D = horizon x parameters)."""
    groups: dict[tuple[int, int], list[Run]] = {}
    for run in runs:
        if run.loss is not None:
            groups.setdefault((run.n, run.d), []).append(run)
    return [
        Point(n, d, groups[n, d][0].tokens_per_parameter, tuple(sorted(groups[n, d], key=lambda r: r.seed)))
        for n, d in sorted(groups)
    ]


def metrics_of(points: list[Point]) -> list[str]:
    """Loss always; bits per byte when every fitted run has it."""
    has_bpb = all(run.bpb is not None for point in points for run in point.runs)
    return ["loss", "bpb"] if has_bpb and points else ["loss"]


def design(points: list[Point], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every run as one observation: N, D and the metric (Hoffmann et al. fit runs, not means)."""
    n = np.array([p.n for p in points for _ in p.runs], dtype=float)
    d = np.array([p.d for p in points for _ in p.runs], dtype=float)
    y = np.concatenate([p.values(metric) for p in points]) if points else np.array([])
    return n, d, y
