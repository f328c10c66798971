"""The workflow plan: a validated workflow config -> every job's recipe, path, resources and the targets.

Built once per workflow parse (rules ask it in one-line input/params functions) and usable without Snakemake:
it imports neither torch nor snakemake. Each stage has its own part of the plan (pipeline/<stage>.py), all
with one small interface (``StagePlan``); this module builds them in dependency order and answers for them
by stage name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from tiny_llm import campaign as campaign_lib
from tiny_llm.config import TRACKING_ENV, recipe_from_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.analysis import AnalysisPlan
from tiny_llm.pipeline.campaign import CampaignPlan
from tiny_llm.pipeline.data import DataPlan
from tiny_llm.pipeline.export import ExportPlan
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.fit import FitPlan
from tiny_llm.pipeline.horizons import HorizonsPlan
from tiny_llm.pipeline.layout import fill
from tiny_llm.pipeline.noise import NoisePlan
from tiny_llm.pipeline.packed import PackedPlan
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.runs import RunsPlan
from tiny_llm.pipeline.schema import validate_config
from tiny_llm.pipeline.stage import Resources, StagePlan
from tiny_llm.pipeline.throughput import ThroughputPlan
from tiny_llm.pipeline.tuning import TuningPlan

STAGES = (
    "data", "runs", "tuning", "campaign", "packed", "export", "analysis", "horizons", "noise", "fit",
    "throughput",
)  # fmt: skip


class WorkflowPlan:
    """Everything the rules need, decided once from the validated config."""

    def __init__(
        self,
        config: dict[str, Any],
        numerics_version: int,
        precheck_campaign: bool = True,
        local_cores: Callable[[], int | None] | int | None = None,
    ) -> None:
        self.config = config
        self.numerics_version = numerics_version
        self.local_cores = local_cores
        self.book = RecipeBook(config)
        self.files = PlanFiles()
        self.book.check_one_cache()
        self.analysis = AnalysisPlan(config["analysis"])
        self._check_analysed_runs()
        keep_epochs = self.analysis.recipe_overrides()
        self.data = DataPlan(self.book, self.files)
        self.runs = RunsPlan(
            self.book, self.files, dict.fromkeys(self.analysis.references("runs"), keep_epochs)
        )
        self.tuning = TuningPlan(self.book, config["tuning"], self.files)
        self.campaign = CampaignPlan(self.book, numerics_version, self.files, precheck_campaign)
        extra = dict.fromkeys(self.analysis.references("packed"), keep_epochs)
        self.packed = PackedPlan(self.book, config["packed"], self.files, extra)
        self.horizons = HorizonsPlan(self.book, config["horizons"], self.files)
        self.noise = NoisePlan(self.book, config["noise"], self.files)
        self.fit = FitPlan(self.book, config["fit"], self.horizons, self.runs, self.campaign, self.files)
        self.throughput = ThroughputPlan(self.book, config["throughput"], self.files)
        self.export = ExportPlan(config["export"], list(config["runs"]), self.campaign, self.files)
        self._add_analysed_runs()
        self.stages: dict[str, StagePlan] = {
            "data": self.data,
            "runs": self.runs,
            "tuning": self.tuning,
            "campaign": self.campaign,
            "packed": self.packed,
            "export": self.export,
            "analysis": self.analysis,
            "horizons": self.horizons,
            "noise": self.noise,
            "fit": self.fit,
            "throughput": self.throughput,
        }
        self.data.plan_cache([need for stage in self.stages.values() for need in stage.cache_tokens_needed()])
        self.tracking_env = self.tracking_environment()

    def tracking_environment(self) -> dict[str, str]:
        """$TINY_LLM_TRACKING for the training jobs: the `tracking` section, checked as a recipe's.

        The environment, not the recipes: turning tracking on or off reruns nothing and leaves every recipe
        identity and campaign setting as it was. Slurm jobs parse the Snakefile again and get it too.
        """
        section = self.config.get("tracking") or {}
        if not section.get("tensorboard") and not section.get("wandb"):
            return {}
        try:
            recipe_from_dict({"tracking": section})
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("invalid recipe: ", "")) from None
        return {TRACKING_ENV: json.dumps(section, sort_keys=True)}

    # ------------------------------------------------------------------ analysed runs

    def _check_analysed_runs(self) -> None:
        known = {"runs": self.config["runs"], "packed": self.config["packed"]["runs"]}
        for kind, names in known.items():
            for run in self.analysis.references(kind):
                if run not in names:
                    where = f"{kind}:{run}" if kind != "runs" else run
                    raise ConfigError(
                        f"analysis.runs: {where} is not in {kind}: {', '.join(names) or 'none'}"
                    )

    def _add_analysed_runs(self) -> None:
        for run in self.analysis.references("runs"):
            self.analysis.add("runs", run, self.runs.recipes[run])
        for run in self.analysis.references("packed"):
            self.analysis.add("packed", run, self.packed.recipes[run])
        for reference in self.analysis.references("campaign"):
            self._add_analysed_campaign_run(reference)

    def _add_analysed_campaign_run(self, reference: str) -> None:
        """A campaign run ``<stage>/<run>``, or ``best-<size>``: the best run of a size (its last stage's
        ranking names it once that stage is ranked). Its size's campaign recipe decides its checkpoints."""
        campaign = self.campaign
        if campaign.config is not None and reference.startswith("best-"):
            size = reference.removeprefix("best-")
            stage = campaign.last_stage_of(size)
            if stage is None:
                sizes = ", ".join(campaign.config.sizes)
                raise ConfigError(
                    f"analysis.runs: campaign:{reference}: no campaign stage trains it ({sizes})"
                )
            recipe = campaign.size_recipe(size)
            self.analysis.add("campaign", reference, recipe, run_dir="", ranking=campaign.ranking(stage))
            return
        stage, _, run = reference.partition("/")
        if stage not in campaign.runs or run not in campaign.run_size:
            raise ConfigError(
                f"analysis.runs: campaign:{reference} is not a run of the campaign (<stage>/<run>)"
            )
        recipe = campaign.size_recipe(campaign.size(run))
        run_dir = fill(campaign.paths.run_dir, stage=stage, run=run)
        self.analysis.add("campaign", reference, recipe, run_dir=run_dir)

    # ------------------------------------------------------------------ stages, targets, resources

    def stage(self, name: str) -> StagePlan:
        if name not in self.stages:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
        return self.stages[name]

    def targets(self, stage: str) -> list[str]:
        """A stage's final files (the named target of the same name)."""
        return self.stage(stage).targets()

    def default_targets(self, stage: str) -> list[str]:
        """A stage's files in `snakemake` with no target: nothing when the config disables the stage."""
        plan = self.stage(stage)
        return plan.targets() if plan.enabled else []

    def stamps(self, stage: str | None = None) -> list[str]:
        """The plan-file stamps a named target (``stage``; None: the default target) takes: those of every
        stage the default target runs, and ``stage``'s (rules/plan_files.smk). A stage this configuration
        leaves out builds nothing, so its target writes nothing either."""
        if stage is not None and not self.stage(stage).enabled:
            return []
        return self.files.stamps(name for name in STAGES if self.stage(name).enabled)

    def uses_gpu(self) -> bool:
        """Whether any size of this configuration trains on a GPU (the demo's do not)."""
        return any(self.book.uses_gpu(size) for size in self.config["sizes"])

    def job_resources(self, stage: str, wildcards: Any) -> Resources:
        return self.stage(stage).resources(wildcards)

    def threads(self, stage: str) -> Callable[[Any], int]:
        """A job's cores. Run locally, a timed job (it measures throughput) takes every core, so that the
        scheduler starts nothing beside it. Its own threads are in its recipe or tuning profile, and on a
        cluster its cores are an allocation."""

        def threads(wildcards: Any) -> int:
            cores = self.local_cores() if callable(self.local_cores) else self.local_cores
            resources = self.job_resources(stage, wildcards)
            return cores if resources.timed and cores else resources.threads

        return threads

    def resources(self, stage: str) -> dict[str, Callable[..., int]]:
        """gpu, mem_mb and runtime (minutes x attempt: a retry after a timeout gets more time)."""

        def gpu(wildcards: Any) -> int:
            return self.job_resources(stage, wildcards).gpu

        def mem_mb(wildcards: Any, attempt: int) -> int:
            return self.job_resources(stage, wildcards).mem_mb

        def runtime(wildcards: Any, attempt: int) -> int:
            return self.job_resources(stage, wildcards).runtime_minutes * attempt

        def nodes(wildcards: Any) -> int:
            return 1  # every job is one process tree; a K-rank training job needs its K GPUs on one node

        return {"gpu": gpu, "mem_mb": mem_mb, "runtime": runtime, "nodes": nodes}

    def launcher(self, stage: str) -> Callable[[Any], str]:
        """What runs a training job's `tiny_llm train`: `python -m`, or `tiny_llm launch` for a size of
        several ranks (one node, sockets on loopback only, K free GPU slots; on SIGTERM it passes the signal
        on and waits up to 100 s, inside the profile's 120 s). A job given a GPU says so
        (TINY_LLM_REQUIRE_CUDA), so that a torch without CUDA fails it in one line, not trains on the CPU."""

        def launch(wildcards: Any) -> str:
            resources = self.job_resources(stage, wildcards)
            prefix = "TINY_LLM_REQUIRE_CUDA=1 " if resources.gpu else ""
            if resources.ranks == 1:
                return f"{prefix}python -m"
            ranks = resources.ranks
            return f"{prefix}python -m tiny_llm launch --nproc-per-node {ranks} --shutdown-timeout 100 -m"

        return launch


def build_plan(
    config: dict[str, Any],
    schema: Mapping[str, Any],
    sources: str = "",
    numerics_version: int = 0,
    precheck_campaign: bool = True,
    local_cores: Callable[[], int | None] | int | None = None,
) -> WorkflowPlan:
    """Validate ``config`` (filling the schema's defaults in place) and plan the workflow.

    ``local_cores``: the cores of a local run, all of which a timed job takes (None on a cluster; a function
    when they are known only once jobs are planned).

    ``precheck_campaign``: refuse a campaign directory that records another campaign
    (`tiny_llm.campaign.precheck`, the one read of ``results/`` the plan makes). Commands that only read a
    plan turn it off.
    """
    validate_config(config, dict(schema), sources)
    expand_home(config)
    return WorkflowPlan(config, numerics_version, precheck_campaign, local_cores)


HOME_PATHS = (("data", "corpus"), ("data", "tokenizer"), ("data", "cache_dir"), ("compile_cache",))
"""Paths of the workflow config where a leading ``~`` is the home directory, as in a shell."""


def expand_home(config: dict[str, Any]) -> None:
    """Expand a leading ``~`` in the HOME_PATHS of a validated config, in place: the rules' paths, the
    recipes and the corpus check all see the home directory, never a literal ``./~/`` tree."""
    for *section, key in HOME_PATHS:
        mapping = config
        for name in section:
            mapping = mapping[name]
        if isinstance(mapping.get(key), str) and mapping[key].startswith("~"):
            mapping[key] = os.path.expanduser(mapping[key])


def campaign_settings_from_config(config: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the workflow hands to `tiny_llm campaign` (`campaign estimate --workflow-config`)."""
    plan = build_plan(config, schema, "--workflow-config", precheck_campaign=False)
    if plan.campaign.config is None:
        raise ConfigError("campaign.stages: this workflow config defines no campaign")
    return campaign_lib.settings_dict(plan.campaign.config)
