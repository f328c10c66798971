"""The noise study's part of the plan: one configuration trained over seeds three ways, to tell where the
seeds' spread of its final loss comes from (SPEC §12, noise decomposition).

``runtime.seed`` seeds the initial weights and ``training.data_seed`` the training data's order (null: the
run seed). Three groups of ``repeats`` runs each: ``init`` varies the run seed with the data seed fixed at
``seed``, ``data`` varies the data seed with the run seed fixed at ``seed``, ``both`` varies the two together.
Each group draws its own seeds (``seed`` + 1 ... for init, the next ``repeats`` for data, the next for both),
so the three groups' variances are independent estimates and their ratios follow an F distribution.
"""

from __future__ import annotations

from typing import Any

from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    NOISE_PLOT,
    NOISE_RECIPE,
    NOISE_RESULT,
    NOISE_RUN_DIR,
    NOISE_SUMMARY,
    NOISE_TABLE,
    fill,
)
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources

SOURCES = ("init", "data", "both")
"""The study's groups: what varies from run to run."""


def noise_seeds(source: str, seed: int, repeats: int) -> list[tuple[int, int]]:
    """(runtime.seed, training.data_seed) of each run of a group; its own seeds never repeat another's."""
    offset = SOURCES.index(source) * repeats
    drawn = [seed + offset + i for i in range(1, repeats + 1)]
    if source == "init":
        return [(s, seed) for s in drawn]
    if source == "data":
        return [(seed, s) for s in drawn]
    return [(s, s) for s in drawn]


class NoisePlan:
    def __init__(self, book: RecipeBook, section: dict[str, Any], files: PlanFiles) -> None:
        self.book = book
        self.section = section
        self.enabled: bool = section["default_target"]
        self.recipes: dict[str, RecipeConfig] = {}
        self.groups: dict[str, list[str]] = {}
        size = section["size"]
        if size is None:
            return
        book.check_size(size, "noise.size")
        for source in SOURCES:
            self.groups[source] = []
            for run_seed, data_seed in noise_seeds(source, section["seed"], section["repeats"]):
                run = f"{size}-{source}-s{run_seed if source != 'data' else data_seed}"
                overrides = {"runtime": {"seed": run_seed}, "training": {"data_seed": data_seed}}
                recipe = book.recipe(size, deep_merge(section["overrides"], overrides), where="noise")
                data = recipe_to_dict(recipe)
                data["runtime"]["output_dir"] = fill(NOISE_RUN_DIR, noise_run=run)
                files.add(fill(NOISE_RECIPE, noise_run=run), data, stage="noise")
                self.recipes[run] = recipe
                self.groups[source].append(run)

    # ------------------------------------------------------------------ jobs and targets

    def results(self) -> list[str]:
        return [fill(NOISE_RESULT, noise_run=run) for run in self.recipes]

    def resources(self, wildcards: Any) -> Resources:
        return self.book.size_resources(self.section["size"])

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(recipe).cache_tokens_needed for recipe in self.recipes.values()]

    def targets(self) -> list[str]:
        return [*self.results(), NOISE_SUMMARY, NOISE_TABLE, NOISE_PLOT] if self.recipes else []

    def estimate(self) -> dict[str, Any]:
        """Training GPU hours: runs x tokens / the size's tokens per second (``noise.throughput``)."""
        if not self.recipes:
            raise ConfigError("noise.size: this workflow config defines no noise study")
        tokens = make_budget(next(iter(self.recipes.values()))).tokens
        rate = self.section["throughput"]
        runs = len(self.recipes)
        hours = runs * tokens / rate / 3600.0 if rate else None
        return {
            "size": self.section["size"],
            "runs": runs,
            "groups": {source: len(runs) for source, runs in self.groups.items()},
            "tokens_per_run": tokens,
            "tokens_per_second": rate,
            "gpu_hours": hours,
        }
