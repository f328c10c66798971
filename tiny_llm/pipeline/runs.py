"""The plain runs' part of the plan: one training job per run, its evaluation and the runs' report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import RUN_DIR, RUN_EVALUATION, RUN_RECIPE, RUN_RESULT, RUNS_REPORT, fill
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources


class RunsPlan:
    enabled = True

    def __init__(
        self, book: RecipeBook, files: PlanFiles, extra: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        """``extra``: run -> recipe keys the workflow adds (e.g. the analysis keeps every epoch's state)."""
        self.book = book
        self.runs: Mapping[str, Mapping[str, Any]] = book.config["runs"]
        self.recipes: dict[str, RecipeConfig] = {}
        for run, spec in self.runs.items():
            overrides = deep_merge(spec["overrides"], dict((extra or {}).get(run, {})))
            recipe = self.recipes[run] = book.recipe(spec["size"], overrides, where=f"runs.{run}")
            data = recipe_to_dict(recipe)
            data["runtime"]["output_dir"] = fill(RUN_DIR, run=run)
            files.add(fill(RUN_RECIPE, run=run), data, stage="runs")

    def size(self, run: str) -> str:
        if run not in self.runs:
            raise ConfigError(f"run '{run}' is not in runs: {', '.join(self.runs) or 'none'}")
        return self.runs[run]["size"]

    def evaluate_flags(self, run: str) -> str:
        self.size(run)
        return "--full" if self.runs[run]["evaluate_full"] else ""

    def results(self) -> list[str]:
        return [fill(RUN_RESULT, run=run) for run in self.runs]

    def evaluations(self) -> list[str]:
        return [fill(RUN_EVALUATION, run=run) for run in self.runs]

    def resources(self, wildcards: Any) -> Resources:
        return self.book.size_resources(self.size(wildcards.run))

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(recipe).cache_tokens_needed for recipe in self.recipes.values()]

    def targets(self) -> list[str]:
        return self.results() + self.evaluations() + RUNS_REPORT.targets() if self.runs else []
