"""The workflow plan: a validated workflow config -> every job's recipe, path, resources and the targets.

Built once per workflow parse (rules ask it in one-line input/params functions) and usable without Snakemake:
it imports neither torch nor snakemake.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_llm import campaign as campaign_lib
from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, deep_merge, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.analysis import AnalysisPlan
from tiny_llm.pipeline.campaign import CampaignPlan
from tiny_llm.pipeline.export import EXPORTS_REPORT_DIR, ExportPlan
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import (
    CORPUS_DIR,
    PACKED_BENCH_DIR,
    PACKED_REPORT_DIR,
    PREPARE_RECIPE,
    RUNS_DIR,
    RUNS_REPORT_DIR,
    TOKENIZER_DIR,
    cache_manifest,
    job_recipe,
    job_result,
)
from tiny_llm.pipeline.packed import PackedPlan
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.schema import validate_config
from tiny_llm.pipeline.tuning import TuningPlan

STAGES = ("data", "runs", "tuning", "campaign", "packed", "export", "analysis")
# Jobs that measure throughput: nothing else may run beside them (see WorkflowPlan.threads).
TIMED_KINDS = ("tuning", "bench")


@dataclass(frozen=True)
class Resources:
    """What one job asks of the scheduler."""

    threads: int
    mem_mb: int
    runtime_minutes: int
    gpu: int


class WorkflowPlan:
    """Everything the rules need, decided once from the validated config."""

    def __init__(
        self,
        config: dict[str, Any],
        numerics_version: int,
        check_files: bool = True,
        local_cores: Callable[[], int | None] | int | None = None,
    ) -> None:
        self.config = config
        self.numerics_version = numerics_version
        self.local_cores = local_cores
        self.book = RecipeBook(config)
        self.files = PlanFiles()
        self.cache_dir: str = config["data"]["cache_dir"]
        self.cache_manifest = cache_manifest(self.cache_dir)
        """The cache as rules name it: never a directory() output, which Snakemake deletes before a rerun."""
        self._cache_needs = [
            make_budget(self.book.size_recipe(size)).cache_tokens_needed for size in config["sizes"]
        ]
        self.book.check_one_cache()
        self.analysis = AnalysisPlan(config["analysis"])
        self._check_analysed_runs()
        self.run_recipes = {run: self._plain_run(run, spec) for run, spec in config["runs"].items()}
        self.tuning = TuningPlan(self.book, config["tuning"], self.files)
        self.campaign = self._campaign(check_files) if config["campaign"]["stages"] else None
        keep_epochs = {run: self.analysis.recipe_overrides() for run in self.analysis.references("packed")}
        self.packed = PackedPlan(self.book, config["packed"], self.files, keep_epochs)
        self._need_cache(*self.packed.recipes.values())
        for run in self.analysis.references("packed"):
            self._cache_needs.append(self.analysis.add("packed", run, self.packed.recipes[run]))
        for reference in self.analysis.references("campaign"):
            self._cache_needs.append(self._analysed_campaign_run(reference))
        self.export = ExportPlan(config["export"], list(config["runs"]), self.campaign, self.files)
        if config["sizes"]:
            self.files.add(PREPARE_RECIPE, self._prepare_recipe())

    def _need_cache(self, *recipes: RecipeConfig) -> None:
        self._cache_needs += [make_budget(recipe).cache_tokens_needed for recipe in recipes]

    def _check_analysed_runs(self) -> None:
        known = {"runs": self.config["runs"], "packed": self.config["packed"]["runs"]}
        for kind, names in known.items():
            for run in self.analysis.references(kind):
                if run not in names:
                    where = f"{kind}:{run}" if kind != "runs" else run
                    raise ConfigError(
                        f"analysis.runs: {where} is not in {kind}: {', '.join(names) or 'none'}"
                    )

    def _plain_run(self, run: str, spec: Mapping[str, Any]) -> RecipeConfig:
        overrides = spec["overrides"]
        if run in self.analysis.references("runs"):
            overrides = deep_merge(overrides, self.analysis.recipe_overrides())
        recipe = self.book.recipe(spec["size"], overrides, where=f"runs.{run}")
        self._need_cache(recipe)
        if run in self.analysis.references("runs"):
            self._cache_needs.append(self.analysis.add("runs", run, recipe))
        data = recipe_to_dict(recipe)
        data["runtime"]["output_dir"] = f"{RUNS_DIR}/{run}"
        self.files.add(job_recipe(RUNS_DIR, run), data)
        return recipe

    def _campaign(self, check_files: bool) -> CampaignPlan:
        campaign = CampaignPlan(self.book, self.numerics_version, self.files)
        for size in campaign.config.sizes:
            overrides = campaign.recipe_overrides(self.book, size)
            self._need_cache(self.book.recipe(size, overrides, where=f"campaign ({size})"))
        if check_files:
            campaign_lib.precheck(campaign.config)
        return campaign

    def _analysed_campaign_run(self, reference: str) -> int:
        """A campaign run ``<stage>/<run>`` to analyse: its size's campaign recipe decides its checkpoints."""
        campaign = self.campaign
        if campaign is not None and reference.startswith("best-"):
            return self._analysed_best_run(campaign, reference.removeprefix("best-"))
        stage, _, run = reference.partition("/")
        if campaign is None or stage not in campaign.runs or run not in campaign.run_size:
            raise ConfigError(
                f"analysis.runs: campaign:{reference} is not a run of the campaign (<stage>/<run>)"
            )
        size = campaign.size(run)
        recipe = self.book.recipe(
            size, campaign.recipe_overrides(self.book, size), where=f"campaign ({size})"
        )
        return self.analysis.add("campaign", reference, recipe, run_dir=f"{campaign.root}/{reference}")

    def _analysed_best_run(self, campaign: CampaignPlan, size: str) -> int:
        """The best run of a campaign size (its last stage's ranking), found once that stage is ranked."""
        stages = [i for i, stage in enumerate(campaign.config.stages) if stage.size == size]
        if not stages:
            sizes = ", ".join(campaign.config.sizes)
            raise ConfigError(f"analysis.runs: campaign:best-{size}: no campaign stage trains it ({sizes})")
        ranking = campaign.ranking(campaign.stage_names[stages[-1]])
        overrides = campaign.recipe_overrides(self.book, size)
        recipe = self.book.recipe(size, overrides, where=f"campaign ({size})")
        return self.analysis.add("campaign", f"best-{size}", recipe, run_dir="", ranking=ranking)

    def _prepare_recipe(self) -> dict[str, Any]:
        """The cache's recipe: the first size's settings, train tokens for the largest budget of any job."""
        first = next(iter(self.config["sizes"]))
        need = max(self._cache_needs)
        return recipe_to_dict(self.book.recipe(first, {"data": {"prepare_train_tokens": need}}))

    # ------------------------------------------------------------------ data

    def prepare_inputs(self) -> dict[str, str]:
        """Rule outputs the cache depends on (nothing for hub corpora and hub tokenizers)."""
        inputs = {}
        if self.config["data"]["corpus"] == "embedded":
            inputs["corpus"] = CORPUS_DIR
        if self.config["data"]["tokenizer"] == "train":
            inputs["tokenizer"] = TOKENIZER_DIR
        return inputs

    def prepare_recipe(self) -> str:
        if PREPARE_RECIPE not in self.files:
            raise ConfigError("sizes: empty; the token cache is prepared for the sizes' recipes, define one")
        return PREPARE_RECIPE

    def tokenizer_vocab_size(self) -> int:
        if not self.config["sizes"]:
            raise ConfigError("data.tokenizer: 'train' needs an entry in sizes (for model.vocab_size)")
        return self.book.size_recipe(next(iter(self.config["sizes"]))).model.vocab_size

    def prepare_runtime_minutes(self) -> int:
        """The demo prepares in seconds, the full C4 prefix takes hours when streamed."""
        return 30 if self.book.is_local_corpus() else 480

    # ------------------------------------------------------------------ plain runs

    def run_size(self, run: str) -> str:
        if run not in self.config["runs"]:
            raise ConfigError(f"run '{run}' is not in runs: {', '.join(self.config['runs']) or 'none'}")
        return self.config["runs"][run]["size"]

    def run_results(self) -> list[str]:
        return [job_result(RUNS_DIR, run) for run in self.config["runs"]]

    def run_evaluations(self) -> list[str]:
        return [f"{RUNS_DIR}/{run}/evaluation.json" for run in self.config["runs"]]

    def run_evaluate_flags(self, run: str) -> str:
        return "--full" if self.config["runs"][run]["evaluate_full"] else ""

    def runs_report(self) -> list[str]:
        names = ("report.md", "comparison.json", "learning-curves.png")
        return [f"{RUNS_REPORT_DIR}/{name}" for name in names]

    # ------------------------------------------------------------------ resources

    def uses_gpu(self) -> bool:
        """Whether any size of this configuration trains on a GPU (the demo's do not)."""
        return any(self.book.uses_gpu(size) for size in self.config["sizes"])

    def size_resources(self, size: str) -> Resources:
        spec = self.config["sizes"][size]
        gpu = int(self.book.uses_gpu(size))
        return Resources(spec["threads"], spec["mem_mb"], spec["runtime_minutes"], gpu)

    def job_resources(self, kind: str, wildcards: Any) -> Resources:
        """Resources of one job of a kind: a training job by its size, a benchmark by its section."""
        if kind == "runs":
            return self.size_resources(self.run_size(wildcards.run))
        if kind == "packed":
            return self.size_resources(self.packed.size(wildcards.packed_run))
        if kind == "campaign":
            return self.size_resources(self.campaign_or_fail().size(wildcards.run))
        if kind == "tuning":
            size = self.size_resources(self.tuning.size(wildcards.profile))
            minutes = self.tuning.candidate_runtime_minutes(wildcards.profile)
            return Resources(size.threads, size.mem_mb, minutes, size.gpu)
        if kind == "analysis":
            section, run = self.config["analysis"], self.analysis.runs[wildcards.aname]
            gpu = int(run.recipe.runtime.device != "cpu")
            return Resources(section["threads"], section["mem_mb"], section["runtime_minutes"], gpu)
        if kind == "bench":
            bench = self.packed.bench or {}
            gpu = int(self.book.uses_gpu(bench["size"]))
            return Resources(bench["threads"], bench["mem_mb"], bench["runtime_minutes"], gpu)
        raise ValueError(f"unknown job kind {kind!r}")

    def threads(self, kind: str) -> Callable[[Any], int]:
        """A job's cores. A timed job run locally takes every core, so that the scheduler starts nothing
        beside it (its own threads are in its recipe or tuning profile); on a cluster it is an allocation."""

        def threads(wildcards: Any) -> int:
            cores = self.local_cores() if callable(self.local_cores) else self.local_cores
            if kind in TIMED_KINDS and cores:
                return cores
            return self.job_resources(kind, wildcards).threads

        return threads

    def resources(self, kind: str) -> dict[str, Callable[..., int]]:
        """gpu, mem_mb and runtime (minutes x attempt: a retry after a timeout gets more time)."""

        def gpu(wildcards: Any) -> int:
            return self.job_resources(kind, wildcards).gpu

        def mem_mb(wildcards: Any, attempt: int) -> int:
            return self.job_resources(kind, wildcards).mem_mb

        def runtime(wildcards: Any, attempt: int) -> int:
            return self.job_resources(kind, wildcards).runtime_minutes * attempt

        return {"gpu": gpu, "mem_mb": mem_mb, "runtime": runtime}

    def where_to_look(self) -> list[str]:
        """The finished results a user looks at first, one line per stage that has them."""
        picks = {
            "runs": [f"{RUNS_REPORT_DIR}/report.md", f"{RUNS_REPORT_DIR}/learning-curves.png"],
            "tuning": self.tuning.targets(),
            "campaign": [f"{self.campaign.root}/report/report.md"] if self.campaign else [],
            "packed": [f"{PACKED_REPORT_DIR}/report.md", f"{PACKED_BENCH_DIR}/summary.json"],
            "export": [f"{EXPORTS_REPORT_DIR}/samples.html", "results/exports/"],
        }
        lines = []
        for stage, files in picks.items():
            present = [path for path in files if Path(path).exists()]
            if present:
                lines.append(f"  {stage:<9} {', '.join(present)}")
        return lines

    # ------------------------------------------------------------------ stages and targets

    def campaign_or_fail(self) -> CampaignPlan:
        if self.campaign is None:
            raise ConfigError("campaign.stages: this workflow config defines no campaign")
        return self.campaign

    def targets(self, stage: str) -> list[str]:
        """A stage's final files (the named target of the same name)."""
        if stage == "data":
            return [self.cache_manifest]
        if stage == "runs":
            return (
                self.run_results() + self.run_evaluations() + self.runs_report()
                if self.config["runs"]
                else []
            )
        if stage == "tuning":
            return self.tuning.targets()
        if stage == "campaign":
            return self.campaign.targets() if self.campaign else []
        if stage == "packed":
            return self.packed.targets()
        if stage == "export":
            return self.export.targets()
        if stage == "analysis":
            return self.analysis.targets()
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")

    def default_targets(self, stage: str) -> list[str]:
        """A stage's files in `snakemake` with no target: nothing when the config disables the stage."""
        enabled = {"campaign": bool(self.campaign and self.campaign.enabled)}
        enabled["packed"] = self.config["packed"]["default_target"]
        enabled["export"] = self.config["export"]["default_target"]
        enabled["analysis"] = self.config["analysis"]["default_target"]
        return self.targets(stage) if enabled.get(stage, True) else []


def build_plan(
    config: dict[str, Any],
    schema: Mapping[str, Any],
    sources: str = "",
    numerics_version: int = 0,
    check_files: bool = True,
    local_cores: Callable[[], int | None] | int | None = None,
) -> WorkflowPlan:
    """Validate ``config`` (filling the schema's defaults in place) and plan the workflow.

    ``local_cores``: the cores of a local run (None on a cluster), which a timed job takes all of; a function
    when they are known only once jobs are planned.
    """
    validate_config(config, dict(schema), sources)
    return WorkflowPlan(config, numerics_version, check_files, local_cores)


def campaign_settings_from_config(config: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the workflow hands to `tiny_llm campaign` (`campaign estimate --workflow-config`)."""
    plan = build_plan(config, schema, "--workflow-config", check_files=False)
    return campaign_lib.settings_dict(plan.campaign_or_fail().config)
