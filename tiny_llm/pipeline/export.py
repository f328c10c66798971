"""The export stage's part of the plan: which models leave the pipeline, where, and what they are asked."""

from __future__ import annotations

import re
from typing import Any

from tiny_llm.campaign import ranking_path, stage_name
from tiny_llm.errors import ConfigError
from tiny_llm.export.settings import sampling_from_dict
from tiny_llm.pipeline.campaign import CampaignPlan
from tiny_llm.pipeline.files import PlanFiles

EXPORTS_DIR = "results/exports"
EXPORTS_REPORT_DIR = "results/report/exports"
PROMPTS_FILE = f"{EXPORTS_DIR}/prompts.yaml"


class ExportPlan:
    def __init__(
        self, section: dict[str, Any], runs: list[str], campaign: CampaignPlan | None, files: PlanFiles
    ) -> None:
        self.section = section
        self.runs = list(runs) if section["runs"] else []
        self.best = self._best_rankings(campaign) if section["campaign"] and campaign else {}
        taken = set(self.runs) & {f"best-{size}" for size in self.best}
        if taken:
            name = sorted(taken)[0]
            raise ConfigError(
                f"runs: run {name} and the best run of campaign size {name[5:]} would both export to "
                f"{EXPORTS_DIR}/{name}; rename the run or set export.runs or export.campaign to false"
            )
        sampling = sampling_from_dict(dict(section["sampling"]), "export.sampling").check("export.sampling")
        files.add(PROMPTS_FILE, {"prompts": list(section["prompts"]), **sampling.as_dict()})

    @staticmethod
    def _best_rankings(campaign: CampaignPlan) -> dict[str, str]:
        """Size -> ranking.json of the last stage that trained the size."""
        last = {stage.size: index for index, stage in enumerate(campaign.config.stages)}
        return {size: ranking_path(campaign.config, stage_name(index)) for size, index in last.items()}

    # ------------------------------------------------------------------ paths

    def run_pattern(self) -> str:
        return "|".join(re.escape(run) for run in self.runs) or "(?!)"

    def size_pattern(self) -> str:
        return "|".join(re.escape(size) for size in self.best) or "(?!)"

    def directories(self) -> list[str]:
        names = self.runs + [f"best-{size}" for size in self.best]
        return [f"{EXPORTS_DIR}/{name}" for name in names]

    def ranking(self, size: str) -> str:
        return self.best[size]

    def report_files(self) -> list[str]:
        names = ("models.html", "samples.html", "exports.md", "exports.json")
        return [f"{EXPORTS_REPORT_DIR}/{name}" for name in names]

    def targets(self) -> list[str]:
        return self.directories() + self.report_files() if self.directories() else []
