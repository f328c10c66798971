"""The packed stage's part of the plan: packed training runs and the packed-vs-sequential benchmark."""

from __future__ import annotations

from typing import Any

from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    PACKED_BENCH_RECIPE,
    PACKED_BENCH_RESULT,
    PACKED_BENCH_SUMMARY,
    PACKED_RECIPE,
    PACKED_REPORT,
    PACKED_RESULT,
    PACKED_RUN_DIR,
    fill,
)
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources

BENCH_MODES = {"compiled": True, "eager": False}
EXECUTIONS = ("packed", "sequential")


def packed_recipe(
    book: RecipeBook, spec: dict[str, Any], overrides: dict[str, Any], where: str
) -> RecipeConfig:
    """A packed recipe: the size's preset <- the packed preset <- defaults and overrides <- data."""
    book.check_size(spec["size"], f"{where}.size")
    book.check_one_gpu(spec["size"], f"{where}.size", "packed runs and their benchmark")
    recipe = book.recipe(spec["size"], overrides, presets=(spec["preset"],), where=where)
    if recipe.decentralized is None:
        raise ConfigError(
            f"{where}.preset: '{spec['preset']}' is not a packed recipe (no decentralized section)"
        )
    return recipe


class PackedPlan:
    def __init__(
        self,
        book: RecipeBook,
        section: dict[str, Any],
        files: PlanFiles,
        extra: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """``extra``: run -> recipe keys the workflow adds (e.g. the analysis keeps every epoch's state)."""
        self.book = book
        self.section = section
        self.enabled: bool = section["default_target"]
        self.runs: dict[str, dict[str, Any]] = section["runs"]
        self.bench: dict[str, Any] | None = section.get("benchmark")
        self.recipes: dict[str, RecipeConfig] = {}
        for run, spec in self.runs.items():
            overrides = deep_merge(spec["overrides"], (extra or {}).get(run, {}))
            recipe = packed_recipe(book, spec, overrides, f"packed.runs.{run}")
            self.recipes[run] = recipe
            data = recipe_to_dict(recipe)
            data["runtime"]["output_dir"] = fill(PACKED_RUN_DIR, packed_run=run)
            files.add(fill(PACKED_RECIPE, packed_run=run), data, stage="packed")
        for n, mode in self.bench_points():
            files.add(
                fill(PACKED_BENCH_RECIPE, n=n, mode=mode), self.bench_recipe(book, n, mode), stage="packed"
            )

    # ------------------------------------------------------------------ benchmark

    def bench_points(self) -> list[tuple[int, str]]:
        if not self.bench:
            return []
        return [(n, mode) for n in self.bench["num_models"] for mode in BENCH_MODES]

    def bench_recipe(self, book: RecipeBook, num_models: int, mode: str) -> dict[str, Any]:
        """N workers at the benchmark's fixed global batch (micro = global / (N x context))."""
        bench = self.bench or {}
        base = packed_recipe(book, bench, bench["overrides"], "packed.benchmark")
        context = base.model.context_length
        global_tokens = bench["global_batch_tokens"] or base.training.batch_tokens
        micro = global_tokens // (num_models * context)
        if micro < 1 or micro * num_models * context != global_tokens:
            raise ConfigError(
                f"packed.benchmark.global_batch_tokens: {global_tokens} is not num_models x micro x context "
                f"for num_models={num_models}, context={context}; pick a multiple of {num_models * context}"
            )
        packed = {
            "decentralized": {"num_models": num_models},
            "training": {"batch_tokens": global_tokens, "micro_batch_size": micro},
            "runtime": {"compile": BENCH_MODES[mode], "cpu_threads": bench["threads"]},
        }
        overrides = deep_merge(bench["overrides"], packed)
        return recipe_to_dict(packed_recipe(book, bench, overrides, "packed.benchmark"))

    def bench_files(self) -> list[str]:
        if not self.bench:
            return []
        modes = [mode for mode, compiled in BENCH_MODES.items() if compiled in self.bench["compile"]]
        return [
            fill(PACKED_BENCH_RESULT, execution=execution, n=n, mode=mode)
            for n in self.bench["num_models"]
            for mode in modes
            for execution in EXECUTIONS
        ]

    def bench_protocol(self) -> str:
        if not self.bench:
            return ""
        bench = self.bench
        steps = f"--warmup {bench['warmup']} --steps {bench['steps']}"
        return f"{steps} --component-steps {bench['component_steps']}"

    # ------------------------------------------------------------------ runs and targets

    def results(self) -> list[str]:
        return [fill(PACKED_RESULT, packed_run=run) for run in self.runs]

    def size(self, run: str) -> str:
        if run not in self.runs:
            raise ConfigError(f"packed run '{run}' is not in packed.runs: {', '.join(self.runs) or 'none'}")
        return self.runs[run]["size"]

    def resources(self, wildcards: Any) -> Resources:
        """A training run's resources come from its size. A benchmark process (it has an ``execution``) is a
        timed job whose resources come from the benchmark's section."""
        if not hasattr(wildcards, "execution"):
            return self.book.size_resources(self.size(wildcards.packed_run))
        bench = self.bench or {}
        gpu = int(self.book.uses_gpu(bench["size"]))
        return Resources(bench["threads"], bench["mem_mb"], bench["runtime_minutes"], gpu, timed=True)

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(recipe).cache_tokens_needed for recipe in self.recipes.values()]

    def targets(self) -> list[str]:
        targets = self.results()
        if targets:
            targets += PACKED_REPORT.first_look()
        if self.bench:
            targets.append(PACKED_BENCH_SUMMARY)
        return targets
