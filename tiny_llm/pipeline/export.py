"""The export stage's part of the plan: which models leave the pipeline, where, and what they are asked."""

from __future__ import annotations

from typing import Any

from tiny_llm.errors import ConfigError
from tiny_llm.export.settings import sampling_from_dict
from tiny_llm.pipeline.campaign import CampaignPlan
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    EXPORT_BEST,
    EXPORT_PROMPTS,
    EXPORT_RUN,
    EXPORTS_JSON,
    EXPORTS_MODELS,
    EXPORTS_SAMPLES,
    EXPORTS_TABLE,
    fill,
)
from tiny_llm.pipeline.stage import Resources


class ExportPlan:
    def __init__(
        self, section: dict[str, Any], runs: list[str], campaign: CampaignPlan, files: PlanFiles
    ) -> None:
        self.section = section
        self.enabled: bool = section["default_target"]
        self.runs = list(runs) if section["runs"] else []
        self.best = self.best_rankings(campaign) if section["campaign"] else {}
        folders = {fill(EXPORT_RUN, run=run): run for run in self.runs}
        taken = sorted(set(folders) & {fill(EXPORT_BEST, size=size) for size in self.best})
        if taken:
            raise ConfigError(
                f"runs: run {folders[taken[0]]} and the best run of a campaign size would both export to "
                f"{taken[0]}; rename the run or set export.runs or export.campaign to false"
            )
        sampling = sampling_from_dict(dict(section["sampling"]), "export.sampling")
        files.add(EXPORT_PROMPTS, {"prompts": list(section["prompts"]), **sampling.as_dict()}, stage="export")

    @staticmethod
    def best_rankings(campaign: CampaignPlan) -> dict[str, str]:
        """Size -> ranking.json of the last stage that trained the size."""
        last = {campaign.stage_size(stage): stage for stage in campaign.stage_names}
        return {size: campaign.ranking(stage) for size, stage in last.items()}

    # ------------------------------------------------------------------ paths

    def directories(self) -> list[str]:
        runs = [fill(EXPORT_RUN, run=run) for run in self.runs]
        return runs + [fill(EXPORT_BEST, size=size) for size in self.best]

    def ranking(self, size: str) -> str:
        if size not in self.best:
            sizes = ", ".join(self.best) or "none"
            raise ConfigError(f"export: no best model of size '{size}' is exported (sizes: {sizes})")
        return self.best[size]

    def options(self) -> str:
        """The export command's options from the section: weight dtype, and --gguf when asked."""
        return f"--dtype {self.section['dtype']}" + (" --gguf" if self.section["gguf"] else "")

    def report_files(self) -> list[str]:
        return [EXPORTS_MODELS, EXPORTS_SAMPLES, EXPORTS_TABLE, EXPORTS_JSON]

    def resources(self, wildcards: Any) -> Resources:
        """Exports run on the CPU: a few GB and minutes even for the largest preset, on one core (they write
        files and sample a few dozen tokens: a second core sat idle and kept other jobs from starting)."""
        return Resources(1, 8000, 30, 0)

    def cache_tokens_needed(self) -> list[int]:
        return []

    def targets(self) -> list[str]:
        return self.directories() + self.report_files() if self.directories() else []
