"""The throughput map's part of the plan: per size x context, microbatches doubling to a confirmed OOM.

Which points run depends on what earlier points measured, so the point rule is a Snakemake checkpoint and the
report's inputs come from ``frontier_points``, which walks each line through ``result_of`` (the rule file's
checkpoint lookup) and stops at the first point not yet measured. Everything else here is static.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tiny_llm.budget import parameter_count
from tiny_llm.config import ModelConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.io import read_json
from tiny_llm.pipeline.data import cache_manifest
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    THROUGHPUT_PLOT,
    THROUGHPUT_POINT,
    THROUGHPUT_RECIPE,
    THROUGHPUT_SUMMARY,
    THROUGHPUT_TABLE,
    fill,
)
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources
from tiny_llm.tuning.throughput_map import (
    PROTOCOL_KEYS,
    estimate,
    frontier,
    point_overrides,
    point_timeout,
    protocol_updates,
    unmeasured_points,
)


class ThroughputPlan:
    def __init__(self, book: RecipeBook, section: dict[str, Any], files: PlanFiles) -> None:
        self.book = book
        self.section = section
        self.sizes: list[str] = list(section["sizes"])
        self.contexts: list[int] = list(section["contexts"])
        self.enabled = bool(section["default_target"]) and bool(self.sizes)
        if self.sizes and not self.contexts:
            raise ConfigError("throughput.contexts: empty; name the context lengths to measure")
        if 0 < section["max_windows"] < section["windows"]:
            raise ConfigError(
                f"throughput.max_windows: 0 or at least windows ({section['windows']}), got "
                f"{section['max_windows']}"
            )
        self.parameters: dict[str, int] = {}
        self.models: dict[str, ModelConfig] = {}
        for size in self.sizes:
            book.check_size(size, "throughput.sizes")
            recipe = book.recipe(size, section["overrides"], where=f"throughput.sizes.{size}")
            self.parameters[size] = parameter_count(recipe.model)
            self.models[size] = recipe.model
            self._check_size(size)
            files.add(fill(THROUGHPUT_RECIPE, size=size), recipe_to_dict(recipe), stage="throughput")

    def _check_size(self, size: str) -> None:
        """Every context must make a valid one-microbatch recipe of the size (checked at parse time)."""
        updates = protocol_updates(self.section)
        for context in self.contexts:
            point = point_overrides(context, 1, self.parameters[size], updates)
            overrides = deep_merge(self.section["overrides"], point)
            self.book.recipe(size, overrides, where=f"throughput (size {size}, context {context})")

    # ------------------------------------------------------------------ paths and the frontier

    def recipe(self, size: str) -> str:
        return fill(THROUGHPUT_RECIPE, size=size)

    def point(self, size: str, context: int, micro: int, trial: str) -> str:
        return fill(THROUGHPUT_POINT, size=size, context=context, micro=micro, trial=trial)

    def point_inputs(self, wildcards: Any) -> dict[str, Any]:
        """The size's recipe and, for real data, the token cache. A confirmation waits for its first try."""
        inputs: dict[str, Any] = {"recipe": self.recipe(wildcards.size)}
        if self.section["data_mode"] == "real":
            inputs["cache"] = cache_manifest(self.book.config["data"]["cache_dir"])
        if wildcards.trial == "confirm":
            inputs["first"] = self.point(wildcards.size, wildcards.context, wildcards.micro, "first")
        return inputs

    def frontier_points(self, result_of: Callable[[str, int, int, str], dict[str, Any]]) -> list[str]:
        """Every point of every line up to its frontier; ``result_of(size, context, micro, trial)`` reads a
        finished point (in the workflow: through the checkpoint, which stops the walk at one not measured)."""
        points = []
        for size in self.sizes:
            for context in self.contexts:
                walk = frontier(partial(result_of, size, context), self.section["max_micro_batch"])
                points += [self.point(size, context, micro, trial) for micro, trial in walk]
        return points

    def protocol_flags(self) -> str:
        return " ".join(f"--{key.replace('_', '-')} {self.section[key]}" for key in PROTOCOL_KEYS)

    def parameters_flag(self) -> str:
        return ",".join(f"{size}={count}" for size, count in self.parameters.items())

    def estimate(self) -> dict[str, Any]:
        return estimate(self.section, self.models)

    def timeout(self, size: str, context: int, micro: int) -> float:
        """A point's timeout in seconds (scaled with its work: ``point_timeout``)."""
        return point_timeout(self.section, self.models[size], context, micro)

    def unmeasured_lines(self) -> list[str]:
        """For the console after a run: each failed or timed-out point of the last report, and how to
        measure it again (nothing when the map has no report yet)."""
        if not self.sizes or not Path(THROUGHPUT_SUMMARY).is_file():
            return []
        try:
            lines = unmeasured_points(read_json(THROUGHPUT_SUMMARY), self.point)
        except (ValueError, KeyError, TypeError):
            return []  # a damaged summary: the report job says so when it runs again
        if not lines:
            return []
        return [
            f"Throughput map: {len(lines)} point(s) measured nothing; to measure one again, run the "
            "throughput target again with --forcerun <its record>:",
            *lines,
        ]

    # ------------------------------------------------------------------ StagePlan

    def targets(self) -> list[str]:
        return [THROUGHPUT_SUMMARY, THROUGHPUT_TABLE, THROUGHPUT_PLOT] if self.sizes else []

    def resources(self, wildcards: Any) -> Resources:
        """A point: its size's threads, memory and device, as a timed job (nothing runs beside it), for as
        long as its timeout, plus ten minutes to start and to write its record."""
        size = self.book.size_resources(wildcards.size)
        timeout = self.timeout(wildcards.size, int(wildcards.context), int(wildcards.micro))
        return Resources(size.threads, size.mem_mb, int(timeout // 60) + 10, size.gpu, timed=True)

    def cache_tokens_needed(self) -> list[int]:
        """One update of the largest point: the worker's real data restarts at the end of the prefix."""
        if not self.sizes or self.section["data_mode"] != "real":
            return []
        return [self.section["max_micro_batch"] * max(self.contexts) + 1]
