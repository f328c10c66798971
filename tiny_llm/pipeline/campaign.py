"""The recipe campaign's part of the plan: settings handed to `tiny_llm campaign`, run ids and their files."""

from __future__ import annotations

import dataclasses
from typing import Any

from tiny_llm import campaign as campaign_lib
from tiny_llm.config import deep_merge, identity_differences
from tiny_llm.errors import ConfigError, TinyLLMError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import tuning_selected
from tiny_llm.pipeline.recipes import RecipeBook


def campaign_config(book: RecipeBook, numerics_version: int) -> campaign_lib.CampaignConfig:
    """The validated campaign of a workflow config: stages, each size's recipe overrides, tuning paths."""
    section = book.config["campaign"]
    for i, stage in enumerate(section["stages"]):
        book.check_size(stage["size"], f"campaign.stages[{i}].size")
    sizes = {}
    for stage in section["stages"]:
        name = stage["size"]
        threads = {"runtime": {"cpu_threads": book.sizes[name]["threads"]}}
        sizes[name] = {"preset": book.sizes[name]["preset"], "overrides": book.overrides(name, threads)}
    tuning = {size: tuning_selected(profile) for size, profile in section["tuning"].items()}
    root = section["output_dir"].rstrip("/")
    try:
        return campaign_lib.parse_campaign({**section, "tuning": tuning}, sizes, root, numerics_version)
    except ConfigError as exc:
        raise ConfigError(f"campaign: {exc}") from None


class CampaignPlan:
    def __init__(self, book: RecipeBook, numerics_version: int, files: PlanFiles) -> None:
        self.enabled: bool = book.config["campaign"]["enabled"]
        self.config = campaign_config(book, numerics_version)
        self.root = self.config.root
        self.runs = campaign_lib.planned_runs(self.config)
        self.run_size = {run.run_id: run.size for runs in self.runs.values() for run in runs}
        self.settings_file = files.add(f"{self.root}/settings.json", campaign_lib.settings_dict(self.config))
        self.stage_names = list(self.runs)
        self.tuned_sizes = set(self.config.tuning)
        self.check_tuning(book)

    def check_tuning(self, book: RecipeBook) -> None:
        """Each profile of campaign.tuning tunes the size's model at the batch its campaign runs train with
        (what `campaign plan` would refuse later, once the tuning has run)."""
        profiles = book.config["tuning"]["profiles"]
        for size, name in book.config["campaign"]["tuning"].items():
            where = f"campaign.tuning.{size}"
            if name not in profiles:
                defined = ", ".join(profiles) or "none"
                raise ConfigError(f"{where}: tuning profile '{name}' is not defined (profiles: {defined})")
            spec = profiles[name]
            tuned = book.recipe(spec["size"], spec["overrides"], where=f"tuning.profiles.{name}")
            runs = book.recipe(size, self.recipe_overrides(book, size), where=f"campaign ({size})")
            if tuned.model != runs.model:
                diffs = identity_differences(dataclasses.asdict(runs.model), dataclasses.asdict(tuned.model))
                raise ConfigError(
                    f"{where}: tuning profile '{name}' tunes another model than size '{size}' "
                    f"({'; '.join(diffs[:3])}); name a profile of size '{size}'"
                )
            measured, trains = tuned.training.batch_tokens, runs.training.batch_tokens
            if measured != trains:
                raise ConfigError(
                    f"{where}: tuning profile '{name}' measures training.batch_tokens={measured}, but the "
                    f"campaign runs of size '{size}' train at {trains}; make tuning.profiles.{name}'s batch "
                    f"and campaign.batch_tokens.{size} agree"
                )

    def recipe_overrides(self, book: RecipeBook, size: str) -> dict[str, Any]:
        """What a campaign run of ``size`` adds to the size's recipe (for the token cache's budget)."""
        overrides = book.config["campaign"]["overrides"]
        batch = book.config["campaign"]["batch_tokens"]
        if size in batch:
            overrides = deep_merge(overrides, {"training": {"batch_tokens": batch[size]}})
        return overrides

    def size(self, run: str) -> str:
        if run not in self.run_size:
            raise ConfigError(f"{run} is not a run of the campaign in {self.root} (see campaign.json)")
        return self.run_size[run]

    def stage_number(self, stage: str) -> int:
        if stage not in self.runs:
            raise ConfigError(
                f"{stage} is not a stage of the campaign in {self.root}: {', '.join(self.runs)}"
            )
        return self.stage_names.index(stage) + 1

    def previous(self, stage: str) -> str:
        return self.stage_names[self.stage_number(stage) - 2]

    def thread_flags(self, run: str, threads: int) -> str:
        """Untuned sizes train with the job's threads; tuned ones keep the threads their tuning selected."""
        return "" if self.size(run) in self.tuned_sizes else f"--set runtime.cpu_threads={threads}"

    def estimate_text(self, wildcards: Any = None) -> str:
        """The GPU-hour estimate as plan_campaign prints it (a params function: the job's message in
        `snakemake -n --quiet host`); a problem with a tuning result is plan_campaign's to report."""
        try:
            return campaign_lib.describe_estimate(campaign_lib.estimate_only(self.config))
        except TinyLLMError as exc:
            return f"unknown ({exc})"

    def report_flags(self) -> str:
        return " ".join(f"--require-size {size}" for size in self.config.sizes)

    # ------------------------------------------------------------------ paths

    def results(self, stage: str) -> list[str]:
        return [f"{campaign_lib.run_dir(self.config, stage, r.run_id)}/result.json" for r in self.runs[stage]]

    def recipes(self, stage: str) -> list[str]:
        return [campaign_lib.recipe_path(self.config, stage, r.run_id) for r in self.runs[stage]]

    def templates(self) -> list[str]:
        return [campaign_lib.template_path(self.config, size) for size in self.config.sizes]

    def template(self, stage: str) -> str:
        return campaign_lib.template_path(self.config, self.config.stages[self.stage_number(stage) - 1].size)

    def ranking(self, stage: str) -> str:
        return campaign_lib.ranking_path(self.config, stage)

    def rankings(self) -> list[str]:
        return [self.ranking(stage) for stage in self.runs]

    def all_results(self) -> list[str]:
        return [path for stage in self.runs for path in self.results(stage)]

    def selected(self) -> list[str]:
        return [f"{self.root}/report/selected-{size}.yaml" for size in self.config.sizes]

    def report_files(self) -> list[str]:
        names = ("report.md", "comparison.json", "learning-curves.png")
        return self.selected() + [f"{self.root}/report/{name}" for name in names]

    def plan_inputs(self, cache: str) -> dict[str, str]:
        tuning = {f"tuning_{size}": path for size, path in self.config.tuning.items()}
        return {"cache": cache, **tuning}

    def targets(self) -> list[str]:
        return self.report_files() + self.rankings()
