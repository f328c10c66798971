"""The horizon study's part of the plan: WSD runs at several horizons from one stable trunk per seed.

For each seed, a trunk trains the longest horizon's recipe up to its decay start, keeping its state at every
shorter horizon's decay start (`train --stop-at-step --keep-state-at`); one branch per horizon continues
from the trunk's state at its own decay start with its own total (`train --from-state`). Each branch ends
bit for bit where an independent WSD run at that horizon ends, for about half the tokens of training them
all (20/40/80/120/160 tokens per parameter: 186 instead of 420).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_llm.budget import make_budget, stable_updates
from tiny_llm.config import RecipeConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    HORIZONS_BRANCH_DIR,
    HORIZONS_BRANCH_RECIPE,
    HORIZONS_BRANCH_RESULT,
    HORIZONS_PLOT,
    HORIZONS_SUMMARY,
    HORIZONS_TRUNK_DIR,
    HORIZONS_TRUNK_RECIPE,
    HORIZONS_TRUNK_STOPPED,
    fill,
)
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources
from tiny_llm.train.continuation import state_name


def horizon_name(horizon: float) -> str:
    """``h20``, ``h0.25``: a branch's directory name."""
    return f"h{horizon:g}"


class HorizonsPlan:
    def __init__(self, book: RecipeBook, section: dict[str, Any], files: PlanFiles) -> None:
        self.book = book
        self.section = section
        self.enabled: bool = section["default_target"]
        self.horizons: list[float] = sorted(section["horizons"])
        self.seeds: list[int] = section["seeds"]
        self.recipes: dict[tuple[int, float], RecipeConfig] = {}
        self.stable: dict[float, int] = {}
        if not self.horizons:
            return
        if section["size"] is None:
            raise ConfigError("horizons.size: name the size the study trains (a key of sizes)")
        if len(set(self.horizons)) < len(self.horizons):
            raise ConfigError(f"horizons.horizons: each horizon once, got {section['horizons']}")
        for seed in self.seeds:
            for horizon in self.horizons:
                overrides = deep_merge(
                    section["overrides"],
                    {"training": {"tokens_per_parameter": horizon}, "runtime": {"seed": seed}},
                )
                recipe = book.recipe(section["size"], overrides, where="horizons")
                self.recipes[seed, horizon] = recipe
                self.stable[horizon] = stable_updates(recipe)
                branch = {"horizon_seed": seed, "horizon": horizon_name(horizon)}
                self._add(files, HORIZONS_BRANCH_DIR, HORIZONS_BRANCH_RECIPE, recipe, branch)
            trunk = self.recipes[seed, self.horizons[-1]]
            self._add(files, HORIZONS_TRUNK_DIR, HORIZONS_TRUNK_RECIPE, trunk, {"horizon_seed": seed})
        self._check(self.recipes[self.seeds[0], self.horizons[-1]])

    @staticmethod
    def _add(
        files: PlanFiles, run_dir: str, recipe_file: str, recipe: RecipeConfig, where: dict[str, Any]
    ) -> None:
        """A run's recipe.yaml, its output_dir the run directory (both patterns filled in with ``where``)."""
        data = recipe_to_dict(recipe)
        data["runtime"]["output_dir"] = fill(run_dir, **where)
        files.add(fill(recipe_file, **where), data, stage="horizons")

    def _check(self, recipe: RecipeConfig) -> None:
        """What the study needs of its recipe, one line each."""
        if recipe.data.shuffle_group_size is None:
            raise ConfigError(
                "horizons: branches continue a shared trunk, which needs loader v2; set "
                "horizons.overrides.data.shuffle_group_size (e.g. 2)"
            )
        opt = recipe.optimizer
        if opt.lr_schedule != "wsd" or opt.warmup_steps is None:
            raise ConfigError(
                "horizons: the horizons share a stable phase only under optimizer.lr_schedule wsd with "
                "optimizer.warmup_steps (and warmup_fraction 0); set them in horizons.overrides"
            )
        if recipe.decentralized is not None and recipe.decentralized.adaptive_consensus is not None:
            raise ConfigError("horizons: adaptive consensus starts at a fraction of the total; drop it")
        points = [self.stable[h] for h in self.horizons]
        if points != sorted(set(points)) or points[0] < 1:
            raise ConfigError(
                f"horizons.horizons: decay starts (after updates {points}) must increase; space the horizons"
            )

    # ------------------------------------------------------------------ jobs and targets

    def horizon(self, name: str) -> float:
        for horizon in self.horizons:
            if horizon_name(horizon) == name:
                return horizon
        raise ConfigError(f"horizon '{name}' is not in horizons.horizons: {self.horizons}")

    def trunk_flags(self) -> str:
        """--stop-at-step (the longest horizon's decay start) and --keep-state-at (every shorter one's)."""
        if not self.horizons:
            return ""
        keep = " ".join(str(self.stable[h]) for h in self.horizons[:-1])
        flags = f"--stop-at-step {self.stable[self.horizons[-1]]}"
        return f"{flags} --keep-state-at {keep}" if keep else flags

    def trunk_done(self, seed: int) -> str:
        return fill(HORIZONS_TRUNK_STOPPED, horizon_seed=seed)

    def branch_state(self, seed: int, name: str) -> str:
        """The trunk's state at the branch's decay start (a file of the trunk's run directory)."""
        trunk = Path(fill(HORIZONS_TRUNK_DIR, horizon_seed=seed))
        return str(trunk / state_name(self.stable[self.horizon(name)]))

    def results(self) -> list[str]:
        return [
            fill(HORIZONS_BRANCH_RESULT, horizon_seed=seed, horizon=horizon_name(horizon))
            for seed in self.seeds
            for horizon in self.horizons
        ]

    def resources(self, wildcards: Any) -> Resources:
        return self.book.size_resources(self.section["size"])

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(recipe).cache_tokens_needed for recipe in self.recipes.values()]

    def targets(self) -> list[str]:
        return [*self.results(), HORIZONS_SUMMARY, HORIZONS_PLOT] if self.horizons else []
