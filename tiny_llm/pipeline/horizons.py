"""The horizon study's part of the plan: WSD runs at several horizons from one stable trunk per size and seed.

For each size and seed, a trunk trains the longest horizon's recipe up to its decay start, keeping its state
at every shorter horizon's decay start (`train --stop-at-step --keep-state-at`); one branch per horizon
continues from the trunk's state at its own decay start with its own total (`train --from-state`). Each
branch ends bit for bit where an independent WSD run at that horizon ends, for about half the tokens of
training them all (20/40/80/120/160 tokens per parameter: 186 instead of 420).

One size (`horizons.size`) keeps its study in results/horizons/; several (`horizons.sizes`, the grid a
scaling fit needs) put each size's in results/horizons/<size>/. A recipe variant (`horizons.variants`, e.g.
Muon) is the same grid under other recipe keys, in results/horizons-<variant>/[<size>/].
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class HorizonStudy:
    """One size's grid of one recipe (the study's or a variant's): its recipes and decay starts."""

    name: str
    """Its directory below results/ (the {horizon_study} wildcard)."""
    size: str
    variant: str | None
    recipes: dict[tuple[int, float], RecipeConfig] = field(default_factory=dict)
    stable: dict[float, int] = field(default_factory=dict)


class HorizonsPlan:
    def __init__(self, book: RecipeBook, section: dict[str, Any], files: PlanFiles) -> None:
        self.book = book
        self.section = section
        self.enabled: bool = section["default_target"]
        self.horizons: list[float] = sorted(section["horizons"])
        self.seeds: list[int] = section["seeds"]
        self.studies: dict[str, HorizonStudy] = {}
        self.sizes: list[str] = []
        if not self.horizons:
            return
        self.sizes = self._sizes()
        if len(set(self.horizons)) < len(self.horizons):
            raise ConfigError(f"horizons.horizons: each horizon once, got {section['horizons']}")
        for variant in [None, *section["variants"]]:
            for size in self.sizes:
                study = self._plan_study(size, variant, files)
                self.studies[study.name] = study
                self._check(study)

    def _sizes(self) -> list[str]:
        """horizons.size, or horizons.sizes (each a key of sizes, each once)."""
        one, many = self.section["size"], self.section["sizes"]
        if one is not None and many:
            raise ConfigError("horizons: give size (one study) or sizes (a grid), not both")
        if one is None and not many:
            raise ConfigError(
                "horizons.size: name the size the study trains (a key of sizes), or horizons.sizes for "
                "several"
            )
        if len(set(many)) < len(many):
            raise ConfigError(f"horizons.sizes: each size once, got {many}")
        for size in self.section["size_overrides"]:
            if size not in (many or [one]):
                raise ConfigError(f"horizons.size_overrides.{size}: not a size of the study")
        return many or [one]

    def study_name(self, size: str, variant: str | None) -> str:
        """results/<this>/seed<S>/...: `horizons`, `horizons/<size>`, `horizons-<variant>[/<size>]`."""
        root = "horizons" if variant is None else f"horizons-{variant}"
        return root if self.section["size"] is not None else f"{root}/{size}"

    def overrides(self, size: str, variant: str | None) -> dict[str, Any]:
        """The study's overrides <- the size's <- the variant's (tokens per parameter and seed come last)."""
        merged = deep_merge(self.section["overrides"], self.section["size_overrides"].get(size, {}))
        if variant is not None:
            merged = deep_merge(merged, self.section["variants"][variant]["overrides"])
        return merged

    def recipe(self, size: str, variant: str | None, seed: int, horizon: float, where: str) -> RecipeConfig:
        """The WSD run of the study at one horizon (a branch, or an independent run such as fit.verify)."""
        extra = {"training": {"tokens_per_parameter": horizon}, "runtime": {"seed": seed}}
        return self.book.recipe(size, deep_merge(self.overrides(size, variant), extra), where=where)

    def _plan_study(self, size: str, variant: str | None, files: PlanFiles) -> HorizonStudy:
        study = HorizonStudy(self.study_name(size, variant), size, variant)
        where = "horizons" if variant is None else f"horizons.variants.{variant}"
        for seed in self.seeds:
            for horizon in self.horizons:
                recipe = self.recipe(size, variant, seed, horizon, where)
                study.recipes[seed, horizon] = recipe
                study.stable[horizon] = stable_updates(recipe)
                branch = {"horizon_study": study.name, "horizon_seed": seed, "horizon": horizon_name(horizon)}
                self._add(files, HORIZONS_BRANCH_DIR, HORIZONS_BRANCH_RECIPE, recipe, branch)
            trunk = study.recipes[seed, self.horizons[-1]]
            where_trunk = {"horizon_study": study.name, "horizon_seed": seed}
            self._add(files, HORIZONS_TRUNK_DIR, HORIZONS_TRUNK_RECIPE, trunk, where_trunk)
        return study

    @staticmethod
    def _add(
        files: PlanFiles, run_dir: str, recipe_file: str, recipe: RecipeConfig, where: dict[str, Any]
    ) -> None:
        """A run's recipe.yaml, its output_dir the run directory (both patterns filled in with ``where``)."""
        data = recipe_to_dict(recipe)
        data["runtime"]["output_dir"] = fill(run_dir, **where)
        files.add(fill(recipe_file, **where), data, stage="horizons")

    def _check(self, study: HorizonStudy) -> None:
        """What the study needs of its recipe, one line each."""
        recipe = study.recipes[self.seeds[0], self.horizons[-1]]
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
        points = [study.stable[h] for h in self.horizons]
        if points != sorted(set(points)) or points[0] < 1:
            raise ConfigError(
                f"horizons.horizons: decay starts (after updates {points}) must increase; space the horizons"
                + ("" if len(self.sizes) == 1 else f" (size {study.size})")
            )

    # ------------------------------------------------------------------ jobs and targets

    def study(self, name: str) -> HorizonStudy:
        if name not in self.studies:
            raise ConfigError(f"'{name}' is not a horizon study: {', '.join(self.studies) or 'none'}")
        return self.studies[name]

    def horizon(self, name: str) -> float:
        for horizon in self.horizons:
            if horizon_name(horizon) == name:
                return horizon
        raise ConfigError(f"horizon '{name}' is not in horizons.horizons: {self.horizons}")

    def trunk_flags(self, study: str) -> str:
        """--stop-at-step (the longest horizon's decay start) and --keep-state-at (every shorter one's)."""
        stable = self.study(study).stable
        keep = " ".join(str(stable[h]) for h in self.horizons[:-1])
        flags = f"--stop-at-step {stable[self.horizons[-1]]}"
        return f"{flags} --keep-state-at {keep}" if keep else flags

    def trunk_done(self, study: str, seed: int) -> str:
        return fill(HORIZONS_TRUNK_STOPPED, horizon_study=study, horizon_seed=seed)

    def branch_state(self, study: str, seed: int, name: str) -> str:
        """The trunk's state at the branch's decay start (a file of the trunk's run directory)."""
        trunk = Path(fill(HORIZONS_TRUNK_DIR, horizon_study=study, horizon_seed=seed))
        return str(trunk / state_name(self.study(study).stable[self.horizon(name)]))

    def study_results(self, study: HorizonStudy) -> list[str]:
        return [
            fill(HORIZONS_BRANCH_RESULT, horizon_study=study.name, horizon_seed=seed, horizon=horizon_name(h))
            for seed in self.seeds
            for h in self.horizons
        ]

    def results(self, variant: str | None = None) -> list[str]:
        """The branches' result.json of the study (or of one variant), size by size."""
        return [
            path
            for study in self.studies.values()
            if study.variant == variant
            for path in self.study_results(study)
        ]

    def variants(self) -> list[str]:
        return list(self.section["variants"]) if self.horizons else []

    def resources(self, wildcards: Any) -> Resources:
        return self.book.size_resources(self.study(wildcards.horizon_study).size)

    def cache_tokens_needed(self) -> list[int]:
        return [
            make_budget(recipe).cache_tokens_needed
            for study in self.studies.values()
            for recipe in study.recipes.values()
        ]

    def targets(self) -> list[str]:
        if not self.horizons:
            return []
        variants = [path for variant in self.variants() for path in self.results(variant)]
        return [*self.results(), *variants, HORIZONS_SUMMARY, HORIZONS_PLOT]
