"""The scaling fit's part of the plan: which runs it fits, the run it predicts (fit.verify), what it costs.

The fit reads the horizon study's branches (every size, and each recipe variant apart) and the runs `fit.runs`
names; it writes results/fit/fit.json and, when `fit.verify` names a run, results/fit/prediction.json, which
that run's training job takes as an input: the prediction exists before the run trains. The verify run is the
study's recipe at another size or horizon, an independent WSD run (results/fit/verify/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiny_llm.budget import make_budget, non_embedding_parameter_count
from tiny_llm.config import RecipeConfig, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.campaign import CampaignPlan
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.horizons import HorizonsPlan, HorizonStudy
from tiny_llm.pipeline.layout import (
    FIT_CURVES,
    FIT_ISOFLOP,
    FIT_JSON,
    FIT_PREDICTION,
    FIT_SUMMARY,
    FIT_TABLE,
    FIT_TABLE_HTML,
    FIT_VERIFY_DIR,
    FIT_VERIFY_RECIPE,
    FIT_VERIFY_RESULT,
    RUN_RESULT,
    fill,
)
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.runs import RunsPlan
from tiny_llm.pipeline.stage import Resources

MIN_SIZES = 3
"""Distinct non-embedding parameter counts the joint law needs (E, A and α from the sizes' floors)."""


class FitPlan:
    def __init__(
        self,
        book: RecipeBook,
        section: dict[str, Any],
        horizons: HorizonsPlan,
        runs: RunsPlan,
        campaign: CampaignPlan,
        files: PlanFiles,
    ) -> None:
        self.book = book
        self.section = section
        self.horizons = horizons
        self.enabled: bool = section["default_target"]
        self.extra = [self._run_result(name, runs, campaign) for name in section["runs"]]
        self.sizes = self._grid_sizes(runs, campaign)
        if self.enabled and self.problem() is not None:
            raise ConfigError(f"{self.problem()} (or fit.default_target: false)")
        self.verify: RecipeConfig | None = None
        if section["verify"] is not None:
            self.verify = self._verify_recipe(section["verify"])
            data = recipe_to_dict(self.verify)
            data["runtime"]["output_dir"] = FIT_VERIFY_DIR
            files.add(FIT_VERIFY_RECIPE, data, stage="fit")

    # ------------------------------------------------------------------ what it fits

    @staticmethod
    def _run_result(name: str, runs: RunsPlan, campaign: CampaignPlan) -> tuple[str, RecipeConfig]:
        """A fit.runs entry: its result.json and the recipe that fixes its parameter count."""
        if name.startswith("campaign:"):
            stage, _, run = name.removeprefix("campaign:").partition("/")
            if stage not in campaign.runs or run not in campaign.run_size:
                raise ConfigError(f"fit.runs: {name} is not a run of the campaign (campaign:<stage>/<run>)")
            recipe = campaign.size_recipe(campaign.size(run))
            return fill(campaign.paths.result, stage=stage, run=run), recipe
        if name not in runs.recipes:
            raise ConfigError(f"fit.runs: '{name}' is not in runs: {', '.join(runs.recipes) or 'none'}")
        return fill(RUN_RESULT, run=name), runs.recipes[name]

    def _grid_sizes(self, runs: RunsPlan, campaign: CampaignPlan) -> dict[int, str]:
        """Non-embedding parameters -> a name, for every model the fit sees (the study's and fit.runs')."""
        sizes = {
            non_embedding_parameter_count(study.recipes[next(iter(study.recipes))].model): study.size
            for study in self._baseline()
        }
        for path, recipe in self.extra:
            sizes.setdefault(non_embedding_parameter_count(recipe.model), Path(path).parent.name)
        return sizes

    def _baseline(self) -> list[HorizonStudy]:
        return [study for study in self.horizons.studies.values() if study.variant is None]

    def _verify_recipe(self, spec: dict[str, Any]) -> RecipeConfig:
        """The study's recipe at the verify size and horizon: refused inside the grid or without a study."""
        if not self.horizons.studies:
            raise ConfigError(
                "fit.verify: the verify run is the horizon study's recipe; set horizons.horizons"
            )
        size, horizon = spec["size"], float(spec["horizon"])
        if size in self.horizons.sizes and horizon in self.horizons.horizons:
            raise ConfigError(
                f"fit.verify: ({size}, {horizon:g} tokens per parameter) is a point of the fitted grid; "
                "name a larger size or a longer horizon"
            )
        seed = spec.get("seed", self.horizons.seeds[0])
        return self.horizons.recipe(size, None, seed, horizon, where="fit.verify")

    def problem(self) -> str | None:
        """Why the fit cannot run with this config (None: it can)."""
        if not self._baseline() and not self.extra:
            return (
                "fit: nothing to fit; give horizons.sizes (at least three) and horizons.horizons, or fit.runs"
            )
        if len(self.sizes) < MIN_SIZES:
            return (
                f"fit: the joint law L(N, D) needs at least {MIN_SIZES} sizes; the fitted runs have "
                f"{len(self.sizes)} ({', '.join(self.sizes.values())}): add sizes to horizons.sizes"
            )
        return None

    def runs(self) -> list[str]:
        """result.json of every fitted run of the study's own recipe."""
        return self.horizons.results() + [path for path, _ in self.extra]

    def variant_runs(self) -> list[str]:
        return [path for variant in self.horizons.variants() for path in self.horizons.results(variant)]

    def law_inputs(self) -> dict[str, list[str]]:
        """The fit job's inputs: every fitted result.json (the study's recipe, then each variant's)."""
        return {"runs": self.runs(), "variants": self.variant_runs()}

    def law_args(self) -> list[str]:
        """`fit law`'s arguments: the run directories (a variant's as name:dir) and the bootstrap settings."""
        args = ["--runs", *(str(Path(p).parent) for p in self.runs())]
        for variant in self.horizons.variants():
            args += ["--variant", *(f"{variant}:{Path(p).parent}" for p in self.horizons.results(variant))]
        section = self.section
        args += ["--bootstrap", str(section["bootstrap"]), "--seed", str(section["seed"])]
        args += ["--confidence", str(section["confidence"])]
        if section["budgets"]:
            args += ["--budgets", *(f"{c:g}" for c in section["budgets"])]
        return args

    def report_inputs(self) -> dict[str, str]:
        """The report's inputs: the fit, and with fit.verify the prediction and the run it predicted."""
        inputs = {"fit": FIT_JSON}
        if self.verify is not None:
            inputs.update(prediction=FIT_PREDICTION, verify=FIT_VERIFY_RESULT)
        return inputs

    def report_args(self) -> list[str]:
        if self.verify is None:
            return []
        return ["--prediction", FIT_PREDICTION, "--verify-run", FIT_VERIFY_DIR]

    # ------------------------------------------------------------------ the price

    def estimate(self) -> dict[str, Any]:
        """GPU hours of the horizon studies (trunks and branches) and the verify run, from the configured
        tokens/s per size (horizons.throughput, a variant's own throughput); unknown where none is given."""
        rows = [self._study_cost(study) for study in self.horizons.studies.values()]
        if self.verify is not None:
            size = self.section["verify"]["size"]
            tokens = make_budget(self.verify).tokens
            rows.append(
                _cost("fit.verify", size, 1, tokens, tokens, self.horizons.section["throughput"].get(size))
            )
        hours = [row["gpu_hours"] for row in rows]
        return {
            "rows": rows,
            "tokens": sum(row["tokens"] for row in rows),
            "independent_tokens": sum(row["independent_tokens"] for row in rows),
            "total_gpu_hours": None if None in hours else sum(hours),
        }

    def _study_cost(self, study: HorizonStudy) -> dict[str, Any]:
        """One size's grid: per seed the trunk to the longest decay start, then each branch's decay."""
        horizons, seeds = self.horizons.horizons, self.horizons.seeds
        longest = study.recipes[seeds[0], horizons[-1]]
        tokens = _tokens_after(longest, study.stable[horizons[-1]])
        for h in horizons:
            recipe = study.recipes[seeds[0], h]
            tokens += make_budget(recipe).tokens - _tokens_after(recipe, study.stable[h])
        alone = sum(make_budget(study.recipes[seeds[0], h]).tokens for h in horizons)
        section = self.horizons.section
        rates = (
            section["throughput"]
            if study.variant is None
            else section["variants"][study.variant]["throughput"]
        )
        return _cost(
            study.name, study.size, len(seeds), tokens * len(seeds), alone * len(seeds), rates.get(study.size)
        )

    # ------------------------------------------------------------------ StagePlan

    def requested_targets(self) -> list[str]:
        """The target `fit`: its files, or, for a config it cannot fit, one line saying what is missing."""
        problem = self.problem()
        if problem is not None:
            raise ConfigError(problem)
        return self.targets()

    def targets(self) -> list[str]:
        """The fit's files (none for a config it cannot fit)."""
        if self.problem() is not None:
            return []
        verify = [FIT_PREDICTION, FIT_VERIFY_RESULT] if self.verify is not None else []
        return [FIT_JSON, *verify, FIT_SUMMARY, FIT_TABLE, FIT_TABLE_HTML, FIT_CURVES, FIT_ISOFLOP]

    def resources(self, wildcards: Any) -> Resources:
        """The verify run's training job (the fit and its report are local jobs)."""
        return self.book.size_resources(self.section["verify"]["size"])

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(self.verify).cache_tokens_needed] if self.verify is not None else []


def _tokens_after(recipe: RecipeConfig, updates: int) -> int:
    """Training tokens of a recipe's first ``updates`` updates."""
    budget = make_budget(recipe)
    return sum(n for _, _, n in budget.update_schedule()[:updates]) * budget.context_length


def _cost(
    what: str, size: str, seeds: int, tokens: int, independent: int, rate: float | None
) -> dict[str, Any]:
    return {
        "what": what,
        "size": size,
        "seeds": seeds,
        "tokens": tokens,
        "independent_tokens": independent,
        "tokens_per_second": rate,
        "gpu_hours": tokens / rate / 3600.0 if rate else None,
    }


def describe_estimate(estimate: dict[str, Any]) -> str:
    """One line per study and the verify run, then the total."""
    lines = []
    for row in estimate["rows"]:
        hours = f"{row['gpu_hours']:.1f} GPU-h" if row["gpu_hours"] is not None else "unknown (no tokens/s)"
        lines.append(
            f"{row['what']}: {row['size']} x {row['seeds']} seed(s), {row['tokens']:,} tokens -> {hours}"
        )
    total = estimate["total_gpu_hours"]
    saved = estimate["independent_tokens"] / max(estimate["tokens"], 1)
    lines.append(
        f"total: {estimate['tokens']:,} tokens ({saved:.2f}x fewer than independent runs) -> "
        + (f"{total:.1f} GPU-h" if total is not None else "unknown")
    )
    return "\n".join(lines)
