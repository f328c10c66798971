"""The second-order analysis stage's part of the plan: which runs, checkpoints and data cases are analysed.

Every (run, checkpoint, case) is one job, known when the workflow is parsed: a run's checkpoint names follow
from its recipe (tiny_llm.analysis.names), and an analysed plain or packed run saves every epoch's state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tiny_llm.analysis.names import CASES, cache_tokens_needed, missing_checkpoints, saved_checkpoints
from tiny_llm.analysis.settings import AnalysisConfig
from tiny_llm.config import RecipeConfig
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.layout import PACKED_DIR, RUNS_DIR

ANALYSIS_DIR = "results/analysis"
SETTING_KEYS = ("noise_samples", "random_samples", "seed", "dtype", "amp", "consensus", "hvp_batch_size")


@dataclass(frozen=True)
class AnalysedRun:
    """One analysed run: its name under results/analysis/, run directory and recipe."""

    name: str
    run_dir: str
    recipe: RecipeConfig
    checkpoints: tuple[str, ...]
    ranking: str | None = None
    """For a campaign size's best run: the ranking.json that names it (the run is known once it is ranked)."""

    @property
    def source(self) -> str:
        """The ``analyze`` option naming the run."""
        return f"--best-of {self.ranking}" if self.ranking else f"--run {self.run_dir}"

    @property
    def ready(self) -> str:
        """The file that exists once the run can be analysed."""
        return self.ranking or f"{self.run_dir}/result.json"


def parse_reference(reference: str) -> tuple[str, str]:
    """``demo-s`` (a plain run), ``packed:<run>`` or ``campaign:<stage>/<run>`` -> (kind, id)."""
    kind, _, run = reference.rpartition(":")
    return (kind or "runs"), run


class AnalysisPlan:
    def __init__(self, section: dict[str, Any]) -> None:
        self.section = section
        self.runs: dict[str, AnalysedRun] = {}
        self.settings = {case: self._settings(case) for case in self.cases()}
        self.tag = self.settings[self.cases()[0]].tag() if self.cases() else ""

    def _settings(self, case: str) -> AnalysisConfig:
        values = {key: self.section[key] for key in SETTING_KEYS}
        try:
            return AnalysisConfig(
                case=case, directions_per_pass=self.section["directions_per_pass"], **values
            )
        except ConfigError as exc:
            raise ConfigError(f"analysis: {exc}") from None

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
    ) -> int:
        """Register an analysed run; returns the train tokens its cache must hold (the unseen case reads past
        the budget)."""
        folder = {"runs": RUNS_DIR, "packed": PACKED_DIR}.get(kind, "")
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
        run_dir = "" if ranking else (run_dir or f"{folder}/{run}")
        other = self.runs.get(name)
        if other is not None and (other.run_dir, other.ranking) != (run_dir, ranking):
            raise ConfigError(
                f"{where}: its results would go to {ANALYSIS_DIR}/{name}, which another analysed run "
                f"({other.run_dir or other.ranking}) writes; rename one of the runs"
            )
        self.runs[name] = AnalysedRun(name, run_dir, recipe, checkpoints, ranking)
        return cache_tokens_needed(recipe, tuple(self.cases()))

    # ------------------------------------------------------------------ paths

    def name_pattern(self) -> str:
        return "|".join(re.escape(name) for name in self.runs) or "(?!)"

    def folder(self, name: str) -> str:
        return f"{ANALYSIS_DIR}/{name}/{self.tag}"

    def jobs(self, name: str) -> list[str]:
        run = self.runs[name]
        cases = self.cases()
        return [
            f"{self.folder(name)}/{ckpt}-{case}/result.json" for ckpt in run.checkpoints for case in cases
        ]

    def flags(self, case: str) -> str:
        return " ".join(self.settings[case].flags())

    def summary_files(self, name: str) -> list[str]:
        names = ("summary.csv", "manifest.json", "alignment.png", "noise-alignment.png", "norms.png")
        return [f"{self.folder(name)}/{file}" for file in names]

    def targets(self) -> list[str]:
        return [path for name in self.runs for path in self.summary_files(name)]


def check_cases(section: dict[str, Any]) -> None:
    unknown = sorted(set(section["cases"]) - set(CASES))
    if unknown:
        raise ConfigError(f"analysis.cases: {', '.join(unknown)} (cases: {', '.join(CASES)})")
