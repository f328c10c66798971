"""Which run and checkpoint an export or generation reads (torch-free).

``--run DIR`` means DIR/resolved.yaml and DIR/final.safetensors (else DIR/final.pt); ``--best-of
RANKING`` means the best run of a campaign stage: the rank-0 row's ``run`` of ``<stage>/ranking.json`` (with
seeds, the best configuration's best seed), whose run directory lies beside the ranking.
"""

from __future__ import annotations

import math
from pathlib import Path

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.io import read_json

WEIGHT_FILES = ("final.safetensors", "final.pt")


def run_inputs(run_dir: str | Path) -> tuple[Path, Path]:
    """(resolved.yaml, final checkpoint) of a finished run directory."""
    run_dir = Path(run_dir)
    recipe = run_dir / "resolved.yaml"
    if not recipe.is_file():
        raise DataError(f"{run_dir} is not a run directory (no resolved.yaml)")
    for name in WEIGHT_FILES:
        if (run_dir / name).is_file():
            return recipe, run_dir / name
    raise DataError(
        f"{run_dir} holds no final checkpoint ({' or '.join(WEIGHT_FILES)}); is the run finished, with a "
        "checkpoint_policy other than none?"
    )


def best_run_dir(ranking: str | Path) -> Path:
    """The directory of the best-ranked run of a stage's ranking.json."""
    ranking = Path(ranking)
    try:
        rows = read_json(ranking)
    except FileNotFoundError:
        raise DataError(f"ranking not found: {ranking}") from None
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict) or "run" not in rows[0]:
        raise DataError(f"{ranking}: not a stage ranking (a list of rows with 'run')")
    best = min(rows, key=lambda row: row.get("rank", math.inf))
    # With seeds, ``loss`` is the configuration's mean (null if any seed diverged) and ``run`` its best seed.
    seed_losses = best.get("run_losses") or []
    if best.get("loss") is None and not any(loss is not None for loss in seed_losses):
        raise DataError(f"{ranking}: no run of the stage has a final loss (all diverged?); nothing to export")
    return ranking.parent / str(best["run"])


def resolve_source(
    configs: list[str] | None,
    sets: list[str] | None,
    *,
    checkpoint: Path | None = None,
    run: Path | None = None,
    best_of: Path | None = None,
) -> tuple[RecipeConfig, Path]:
    """The recipe and checkpoint of exactly one source: ``checkpoint`` (with ``configs``), a run directory
    or a stage ranking's best run (``configs``/``sets`` then apply over its resolved.yaml)."""
    given = [x for x in (checkpoint, run, best_of) if x is not None]
    if len(given) != 1:
        raise ConfigError("give exactly one of --checkpoint (with --config), --run DIR or --best-of RANKING")
    if checkpoint is not None:
        if not configs:
            raise ConfigError("--checkpoint needs --config (the run's resolved.yaml)")
        return load_recipe(configs, sets), checkpoint
    run_dir = run if run is not None else best_run_dir(best_of)  # type: ignore[arg-type]
    recipe_file, weights = run_inputs(run_dir)
    return load_recipe([str(recipe_file), *(configs or [])], sets), weights
