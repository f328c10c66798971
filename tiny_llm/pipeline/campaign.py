"""The recipe campaign's part of the plan: settings handed to `tiny_llm campaign`, run ids and their files.

The campaign's recipes come from the library's own builder (`tiny_llm.campaign.build_template`), the function
the plan_campaign job runs, so the plan sizes the token cache and checks tuning profiles on the very recipes
the runs train with. A workflow config without stages still has a (disabled) campaign plan: its rules are
always defined, and only its targets are empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tiny_llm import campaign as campaign_lib
from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, recipe_from_dict, recipe_to_dict
from tiny_llm.errors import ConfigError, TinyLLMError
from tiny_llm.io import read_json
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import CAMPAIGN, TUNING_SELECTED, fill
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources


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
    tuning = {size: fill(TUNING_SELECTED, profile=profile) for size, profile in section["tuning"].items()}
    root = section["output_dir"].rstrip("/")
    try:
        return campaign_lib.parse_campaign({**section, "tuning": tuning}, sizes, root, numerics_version)
    except ConfigError as exc:
        raise ConfigError(f"campaign: {exc}") from None


class CampaignPlan:
    def __init__(self, book: RecipeBook, numerics_version: int, files: PlanFiles, precheck: bool) -> None:
        section = book.config["campaign"]
        self.book = book
        self.root: str = section["output_dir"].rstrip("/")
        self.paths = CAMPAIGN.under(self.root)
        self.settings_file = self.paths.settings
        self.config = campaign_config(book, numerics_version) if section["stages"] else None
        self.enabled: bool = section["enabled"] and self.config is not None
        self.runs = campaign_lib.planned_runs(self.config) if self.config else {}
        self.run_size = {run.run_id: run.size for runs in self.runs.values() for run in runs}
        self.configuration_size = {run.configuration: run.size for runs in self.runs.values() for run in runs}
        self.tie_run_pattern: str = campaign_lib.TIE_RUN
        """The run ids of extra seeds at a cut (``campaign.promotion.resolve_ties``)."""
        self.stage_names = list(self.runs)
        self.tuned_sizes = set(self.config.tuning) if self.config else set()
        self.size_recipes: dict[str, RecipeConfig] = {}
        if self.config is None:
            return
        files.add(self.settings_file, campaign_lib.settings_dict(self.config), stage="campaign")
        # every stage's recipes, those of the runs a tie round adds included, and the templates
        recipes = re.escape(self.root) + r"/stage[0-9]+/[^/]+/recipe\.yaml"
        files.add_recorded(self.templates(), pattern=recipes)
        for size in self.config.sizes:
            self.size_recipes[size] = recipe_from_dict(campaign_lib.build_template(self.config, size))
        self.check_tuning()
        if precheck:  # the one read of results/ while the plan is built: a changed campaign is refused here
            try:
                campaign_lib.precheck(self.config)
            except campaign_lib.CampaignChangedError as exc:
                raise campaign_lib.CampaignChangedError(f"campaign.output_dir: {exc}") from None

    def check_tuning(self) -> None:
        """Each profile of campaign.tuning tunes the size's model at the batch its campaign runs train with
        (what `campaign plan` would refuse later, once the tuning has run: the same check)."""
        profiles = self.book.config["tuning"]["profiles"]
        for size, name in self.book.config["campaign"]["tuning"].items():
            if name not in profiles:
                defined = ", ".join(profiles) or "none"
                raise ConfigError(
                    f"campaign.tuning.{size}: tuning profile '{name}' is not defined (profiles: {defined})"
                )
            spec = profiles[name]
            tuned = self.book.recipe(spec["size"], spec["overrides"], where=f"tuning.profiles.{name}")
            campaign_lib.check_tuning_fits(
                recipe_to_dict(tuned),
                recipe_to_dict(self.size_recipes[size]),
                size,
                f"tuning profile '{name}'",
            )

    def size(self, run: str) -> str:
        extra = campaign_lib.parse_tie_run(run)
        if run not in self.run_size and extra and extra[0] in self.configuration_size:
            return self.configuration_size[extra[0]]
        if run not in self.run_size:
            raise ConfigError(f"{run} is not a run of the campaign in {self.root} (see campaign.json)")
        return self.run_size[run]

    def size_recipe(self, size: str) -> RecipeConfig:
        """The recipe every campaign run of ``size`` starts from (before tuning and its optimizer values)."""
        return self.size_recipes[size]

    def stage_number(self, stage: str) -> int:
        if stage not in self.runs:
            stages = ", ".join(self.runs) or "none: campaign.stages is empty"
            raise ConfigError(f"{stage} is not a stage of the campaign in {self.root}: {stages}")
        return self.stage_names.index(stage) + 1

    def stage_size(self, stage: str) -> str:
        number = self.stage_number(stage)
        assert self.config is not None  # a stage exists
        return self.config.stages[number - 1].size

    def previous(self, stage: str) -> str:
        return self.stage_names[self.stage_number(stage) - 2]

    def last_stage_of(self, size: str) -> str | None:
        """The last stage that trains ``size`` (its ranking names the size's best run)."""
        stages = [stage for stage in self.stage_names if self.stage_size(stage) == size]
        return stages[-1] if stages else None

    def thread_flags(self, run: str, threads: int) -> str:
        """Untuned sizes train with the job's threads; tuned ones keep the threads their tuning selected."""
        return "" if self.size(run) in self.tuned_sizes else f"--set runtime.cpu_threads={threads}"

    def estimate_text(self, wildcards: Any = None) -> str:
        """The GPU-hour estimate as plan_campaign prints it, for the job's message in `snakemake -n`.

        A problem with a tuning result is left for plan_campaign to report."""
        if self.config is None:
            return ""
        try:
            return campaign_lib.describe_estimate(campaign_lib.estimate_only(self.config))
        except TinyLLMError as exc:
            return f"unknown ({exc})"

    def report_flags(self) -> str:
        sizes = self.config.sizes if self.config else {}
        return " ".join(f"--require-size {size}" for size in sizes)

    def resources(self, wildcards: Any) -> Resources:
        return self.book.size_resources(self.size(wildcards.run))

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(recipe).cache_tokens_needed for recipe in self.size_recipes.values()]

    # ------------------------------------------------------------------ paths

    def results(self, stage: str) -> list[str]:
        return [fill(self.paths.result, stage=stage, run=r.run_id) for r in self.runs[stage]]

    def recipes(self, stage: str) -> list[str]:
        return [fill(self.paths.recipe, stage=stage, run=r.run_id) for r in self.runs.get(stage, [])]

    def templates(self) -> list[str]:
        sizes = self.config.sizes if self.config else {}
        return [fill(self.paths.template, size=size) for size in sizes]

    def template(self, stage: str) -> str:
        return fill(self.paths.template, size=self.stage_size(stage))

    def ranking(self, stage: str) -> str:
        return fill(self.paths.ranking, stage=stage)

    def rankings(self) -> list[str]:
        return [self.ranking(stage) for stage in self.runs]

    def all_results(self) -> list[str]:
        return [path for stage in self.runs for path in self.results(stage)]

    def selected(self) -> list[str]:
        sizes = self.config.sizes if self.config else {}
        return [fill(self.paths.selected, size=size) for size in sizes]

    def report_files(self) -> list[str]:
        return self.selected() + self.paths.report.targets()

    def plan_inputs(self, cache: str) -> dict[str, str]:
        tuning = {
            f"tuning_{size}": path for size, path in (self.config.tuning if self.config else {}).items()
        }
        return {"cache": cache, **tuning}

    def targets(self) -> list[str]:
        return self.report_files() + self.rankings() if self.config else []

    # ------------------------------------------------------------------ extra seeds at a cut

    def tie_round(self, stage: str, round_: int | str) -> str:
        """A tie-resolving round's decision file (``campaign.promotion.resolve_ties``)."""
        return fill(self.paths.tie_round, stage=stage, round=round_)

    def tie_inputs(
        self, stage: str, decided: Callable[[str, int], str], before: int | str | None = None
    ) -> list[str]:
        """The stage's decided round files and the results of the extra seeds each adds, round by round until
        one adds none (or up to ``before``); ``decided(stage, round)`` is a decided round's file (in the
        workflow: through the checkpoint, which stops the walk at a round not decided yet). Empty without the
        rule, so the DAG is the one the reference's promotion has."""
        if self.config is None:
            return []
        files: list[str] = []
        for round_ in campaign_lib.tie_rounds(self.config, self.stage_number(stage) - 1):
            if before is not None and round_ >= int(before):
                break
            path = decided(stage, round_)
            runs = read_json(path)["runs"]
            files += [path, *(fill(self.paths.result, stage=stage, run=entry["run"]) for entry in runs)]
            if not runs:
                break
        return files

    def tie_decision(self, stage: str, run: str) -> str:
        """The round file that added the extra seed ``run``."""
        _, round_, _ = self._tie_run(run)
        return self.tie_round(stage, round_)

    def tie_source(self, stage: str, run: str) -> str:
        """The recipe an extra seed copies: its configuration's first planned run's."""
        configuration, _, _ = self._tie_run(run)
        assert self.config is not None  # _tie_run checked that the campaign has the configuration
        return fill(
            self.paths.recipe, stage=stage, run=campaign_lib.first_run_of(self.config, stage, configuration)
        )

    def _tie_run(self, run: str) -> tuple[str, int, int]:
        extra = campaign_lib.parse_tie_run(run)
        if extra is None or extra[0] not in self.configuration_size:
            raise ConfigError(f"{run} is no extra seed of a configuration of the campaign in {self.root}")
        return extra
