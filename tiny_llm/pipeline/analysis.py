"""The second-order analysis stage's part of the plan: which runs, checkpoints and data cases are analysed.

Every (run, checkpoint, case) is one job, known when the workflow is parsed: a run's checkpoint names follow
from its recipe (tiny_llm.analysis.names), and an analysed plain or packed run saves every epoch's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiny_llm.analysis.names import cache_tokens_needed, missing_checkpoints, saved_checkpoints
from tiny_llm.analysis.settings import AnalysisConfig
from tiny_llm.config import RecipeConfig
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.layout import (
    ANALYSIS_ALIGNMENT,
    ANALYSIS_JOB,
    ANALYSIS_MANIFEST,
    ANALYSIS_NOISE,
    ANALYSIS_NORMS,
    ANALYSIS_RUN_DIR,
    ANALYSIS_SUMMARY,
    PACKED_RUN_DIR,
    RUN_DIR,
    fill,
)
from tiny_llm.pipeline.stage import Resources
from tiny_llm.typed import typed_from_dict

SETTING_KEYS = (
    "noise_samples",
    "random_samples",
    "seed",
    "dtype",
    "amp",
    "consensus",
    "hvp_batch_size",
    "directions_per_pass",
)


@dataclass(frozen=True)
class AnalysedRun:
    """One analysed run: its name in the analysis' paths (``analysed_run``), run directory and recipe."""

    name: str
    run_dir: str
    recipe: RecipeConfig
    checkpoints: tuple[str, ...]
    ranking: str | None = None
    """For a campaign size's best run: the ranking.json that names it (the run is known once it is ranked)."""

    @property
    def source(self) -> list[str]:
        """The ``analyze`` option naming the run, as arguments (a path may hold spaces)."""
        return ["--best-of", self.ranking] if self.ranking else ["--run", self.run_dir]

    @property
    def ready(self) -> str:
        """The file that exists once the run can be analysed."""
        return self.ranking or f"{self.run_dir}/result.json"

    @property
    def metrics_flag(self) -> list[str]:
        """The summary's ``--metrics`` option: training's logged gradient norms (none for a best-of run)."""
        return ["--metrics", f"{self.run_dir}/metrics.jsonl"] if self.run_dir else []


def parse_reference(reference: str) -> tuple[str, str]:
    """``demo-s`` (a plain run), ``packed:<run>`` or ``campaign:<stage>/<run>`` -> (kind, id)."""
    kind, _, run = reference.rpartition(":")
    return (kind or "runs"), run


class AnalysisPlan:
    def __init__(self, section: dict[str, Any]) -> None:
        self.section = section
        self.enabled: bool = section["default_target"]
        self.runs: dict[str, AnalysedRun] = {}
        self._cache_needs: list[int] = []
        self.settings = {case: self._settings(case) for case in self.cases()}
        self.tag = self.settings[self.cases()[0]].tag() if self.cases() else ""

    def _settings(self, case: str) -> AnalysisConfig:
        values = {key: self.section[key] for key in SETTING_KEYS}
        return typed_from_dict(AnalysisConfig, {"case": case, **values}, "analysis")

    def cases(self) -> list[str]:
        return list(dict.fromkeys(self.section["cases"]))

    def wanted(self) -> list[str] | None:
        """Checkpoint names asked for, or None for every checkpoint a run saves."""
        chosen = self.section["checkpoints"]
        return None if chosen == "all" else list(chosen)

    # ------------------------------------------------------------------ which runs

    def references(self, kind: str) -> list[str]:
        return [run for k, run in map(parse_reference, self.section["runs"]) if k == kind]

    def recipe_overrides(self) -> dict[str, Any]:
        """What an analysed plain or packed run adds to its recipe: every epoch's state is kept."""
        return {"training": {"checkpoint_policy": "all"}}

    def add(
        self,
        kind: str,
        run: str,
        recipe: RecipeConfig,
        run_dir: str | None = None,
        ranking: str | None = None,
    ) -> None:
        """Register an analysed run (its cache must hold the unseen case, which reads past the budget)."""
        name = run if kind == "runs" else f"{kind}-{run.replace('/', '-')}"
        where = f"analysis.runs: {kind}:{run}" if kind != "runs" else f"analysis.runs: {run}"
        wanted = self.wanted()
        missing = missing_checkpoints(recipe, wanted) if wanted else []
        if missing:
            policy = recipe.training.checkpoint_policy
            raise ConfigError(f"{where}: the run saves no {', '.join(missing)} (checkpoint_policy {policy})")
        checkpoints = tuple(wanted or saved_checkpoints(recipe))
        if not checkpoints:
            raise ConfigError(f"{where}: the run saves no checkpoint (checkpoint_policy none)")
        default_dir = {"runs": RUN_DIR, "packed": PACKED_RUN_DIR}.get(kind, "")
        run_dir = "" if ranking else (run_dir or fill(default_dir, run=run, packed_run=run))
        other = self.runs.get(name)
        if other is not None and (other.run_dir, other.ranking) != (run_dir, ranking):
            folder = fill(ANALYSIS_RUN_DIR, analysed_run=name)
            raise ConfigError(
                f"{where}: its results would go to {folder}, which another analysed run "
                f"({other.run_dir or other.ranking}) writes; rename one of the runs"
            )
        self.runs[name] = AnalysedRun(name, run_dir, recipe, checkpoints, ranking)
        self._cache_needs.append(cache_tokens_needed(recipe, tuple(self.cases())))

    def run(self, name: str) -> AnalysedRun:
        if name not in self.runs:
            raise ConfigError(f"analysis: '{name}' is not an analysed run ({', '.join(self.runs) or 'none'})")
        return self.runs[name]

    # ------------------------------------------------------------------ paths

    def jobs(self, name: str) -> list[str]:
        run = self.run(name)
        return [
            fill(ANALYSIS_JOB, analysed_run=name, settings_tag=self.tag, checkpoint_name=ckpt, case=case)
            for ckpt in run.checkpoints
            for case in self.cases()
        ]

    def flags(self, case: str) -> str:
        return " ".join(self.settings[case].flags())

    def summary_files(self, name: str) -> list[str]:
        files = (ANALYSIS_SUMMARY, ANALYSIS_MANIFEST, ANALYSIS_ALIGNMENT, ANALYSIS_NOISE, ANALYSIS_NORMS)
        return [fill(path, analysed_run=name, settings_tag=self.tag) for path in files]

    def resources(self, wildcards: Any) -> Resources:
        section, run = self.section, self.run(wildcards.analysed_run)
        gpu = int(run.recipe.runtime.device != "cpu")
        return Resources(section["threads"], section["mem_mb"], section["runtime_minutes"], gpu)

    def cache_tokens_needed(self) -> list[int]:
        return list(self._cache_needs)

    def targets(self) -> list[str]:
        return [path for name in self.runs for path in self.summary_files(name)]
