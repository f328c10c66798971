"""The horizon study's part of the plan: WSD runs at several horizons from one stable trunk per seed.

For each seed, a trunk trains the longest horizon's recipe up to its decay start, keeping its state at every
shorter horizon's decay start (`train --stop-at-step --keep-state-at`); one branch per horizon continues
from the trunk's state at its own decay start with its own total (`train --from-state`). Each branch ends
bit for bit where an independent WSD run at that horizon ends, for about half the tokens of training them
all (20/40/80/120/160 tokens per parameter: 186 instead of 420).
"""

from __future__ import annotations

from typing import Any

from tiny_llm.budget import make_budget, stable_updates
from tiny_llm.config import RecipeConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.train.continuation import STOPPED, state_name

HORIZONS_DIR = "results/horizons"
HORIZONS_REPORT_DIR = "results/report/horizons"
TRUNK = "trunk"


def horizon_name(horizon: float) -> str:
    """``h20``, ``h0.25``: a branch's directory name."""
    return f"h{horizon:g}"


class HorizonsPlan:
    def __init__(self, book: RecipeBook, section: dict[str, Any], files: PlanFiles) -> None:
        self.section = section
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
                self._add(files, self.branch_dir(seed, horizon), recipe)
            self._add(files, self.trunk_dir(seed), self.recipes[seed, self.horizons[-1]])
        self._check(self.recipes[self.seeds[0], self.horizons[-1]])

    @staticmethod
    def _add(files: PlanFiles, run_dir: str, recipe: RecipeConfig) -> None:
        data = recipe_to_dict(recipe)
        data["runtime"]["output_dir"] = run_dir
        files.add(f"{run_dir}/recipe.yaml", data)

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

    # ------------------------------------------------------------------ paths and jobs

    @staticmethod
    def seed_dir(seed: int) -> str:
        return f"{HORIZONS_DIR}/seed{seed}"

    def trunk_dir(self, seed: int) -> str:
        return f"{self.seed_dir(seed)}/{TRUNK}"

    def branch_dir(self, seed: int, horizon: float) -> str:
        return f"{self.seed_dir(seed)}/{horizon_name(horizon)}"

    def horizon(self, name: str) -> float:
        for horizon in self.horizons:
            if horizon_name(horizon) == name:
                return horizon
        raise ConfigError(f"horizon '{name}' is not in horizons.horizons: {self.horizons}")

    def trunk_flags(self) -> str:
        """--stop-at-step (the longest horizon's decay start) and --keep-state-at (every shorter one's)."""
        keep = " ".join(str(self.stable[h]) for h in self.horizons[:-1])
        flags = f"--stop-at-step {self.stable[self.horizons[-1]]}"
        return f"{flags} --keep-state-at {keep}" if keep else flags

    def trunk_done(self, seed: int) -> str:
        return f"{self.trunk_dir(seed)}/{STOPPED}"

    def branch_state(self, seed: int, name: str) -> str:
        return f"{self.trunk_dir(seed)}/{state_name(self.stable[self.horizon(name)])}"

    def results(self) -> list[str]:
        return [f"{self.branch_dir(s, h)}/result.json" for s in self.seeds for h in self.horizons]

    def size(self) -> str:
        return self.section["size"]

    def cache_needs(self) -> list[int]:
        return [make_budget(recipe).cache_tokens_needed for recipe in self.recipes.values()]

    def targets(self) -> list[str]:
        if not self.horizons:
            return []
        return [
            *self.results(),
            f"{HORIZONS_REPORT_DIR}/horizons.json",
            f"{HORIZONS_REPORT_DIR}/loss-vs-horizon.png",
        ]
