"""Helpers for the training-run tests: a small deterministic `tiny` recipe and metric comparisons."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.train.rows import TIMING_FIELDS

# 28 updates of 16 blocks in 3 epochs, each ending with a short update (5, 5 and 3 blocks).
SMALL = [
    "training.tokens_per_parameter=0.2",
    "training.epoch_tokens_per_parameter=0.08",
    "training.log_every=2",
    "evaluation.batch_size=64",
    "runtime.cpu_threads=1",
    "runtime.deterministic=true",
]


def small_recipe(
    cache: Path, recipe_args: Callable[[Path], list[str]], run_dir: Path, *extra: str
) -> RecipeConfig:
    return load_recipe(["tiny"], [*recipe_args(cache), *SMALL, f"runtime.output_dir={run_dir}", *extra])


def cli_sets(cache: Path, recipe_args: Callable[[Path], list[str]], run_dir: Path, *extra: str) -> list[str]:
    sets = [*recipe_args(cache), *SMALL, f"runtime.output_dir={run_dir}", *extra]
    return ["--config", "tiny", *[a for s in sets for a in ("--set", s)]]


def metric_rows(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the wall-clock fields (which differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]
