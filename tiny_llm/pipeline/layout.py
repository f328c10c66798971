"""Where the workflow puts its files: every artifact is one wildcard pattern, written once, here.

Rules name these patterns as their inputs and outputs and Snakemake fills in the wildcards; the plan fills in
the same patterns with ``fill`` for its target lists. The campaign's files lie under its configurable root:
their patterns start with ``{campaign}``, which the campaign plan fills in first (``CampaignLayout``). The
README's table describes the same layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

# ----------------------------------------------------------------------------- data
CORPUS_DIR = "results/data/corpus"
TOKENIZER_DIR = "results/data/tokenizer"
PREPARE_RECIPE = "results/data/prepare.yaml"

# ----------------------------------------------------------------------------- plan files
PLAN_STAMP = "results/.plan/{plan_stamp}"
"""A plan file's stamp, an empty file named ``<sha256 of its path>-<digest of its content>``."""

# ----------------------------------------------------------------------------- plain runs
RUN_DIR = "results/runs/{run}"
RUN_RECIPE = "results/runs/{run}/recipe.yaml"
RUN_RESULT = "results/runs/{run}/result.json"
RUN_EVALUATION = "results/runs/{run}/evaluation.json"

# ----------------------------------------------------------------------------- tuning
TUNING_DIR = "results/{profile}-tuning"
TUNING_PROFILE = "results/{profile}-tuning/profile.yaml"
TUNING_PLAN = "results/{profile}-tuning/plan.json"
TUNING_CANDIDATE = "results/{profile}-tuning/candidates/{slot}.json"
TUNING_SELECTED = "results/{profile}-tuning/selected.yaml"
TUNING_SUMMARY = "results/{profile}-tuning/summary.json"
TUNING_PLOT = "results/{profile}-tuning/throughput.png"

# ----------------------------------------------------------------------------- packed
PACKED_RUN_DIR = "results/packed/{packed_run}"
PACKED_RECIPE = "results/packed/{packed_run}/recipe.yaml"
PACKED_RESULT = "results/packed/{packed_run}/result.json"
PACKED_BENCH_RECIPE = "results/packed-benchmarks/n{n}-{mode}/recipe.yaml"
PACKED_BENCH_RESULT = "results/packed-benchmarks/{execution}-n{n}-{mode}.json"
PACKED_BENCH_SUMMARY = "results/packed-benchmarks/summary.json"
PACKED_BENCH_PLOT = "results/packed-benchmarks/speedup.png"

# ----------------------------------------------------------------------------- export
EXPORTS_DIR = "results/exports"
EXPORT_PROMPTS = "results/exports/prompts.yaml"
EXPORT_RUN = "results/exports/{run}"
EXPORT_BEST = "results/exports/best-{size}"
EXPORTS_MODELS = "results/report/exports/models.html"
EXPORTS_SAMPLES = "results/report/exports/samples.html"
EXPORTS_TABLE = "results/report/exports/exports.md"
EXPORTS_JSON = "results/report/exports/exports.json"

# ----------------------------------------------------------------------------- analysis
# <settings_tag> names the measured settings (s32-r32-seed42, ...); <checkpoint_name> is epoch-NNN or final.
ANALYSIS_RUN_DIR = "results/analysis/{analysed_run}"
ANALYSIS_JOB = "results/analysis/{analysed_run}/{settings_tag}/{checkpoint_name}-{case}/result.json"
ANALYSIS_SUMMARY = "results/analysis/{analysed_run}/{settings_tag}/summary.csv"
ANALYSIS_MANIFEST = "results/analysis/{analysed_run}/{settings_tag}/manifest.json"
ANALYSIS_ALIGNMENT = "results/analysis/{analysed_run}/{settings_tag}/alignment.png"
ANALYSIS_NOISE = "results/analysis/{analysed_run}/{settings_tag}/noise-alignment.png"
ANALYSIS_NORMS = "results/analysis/{analysed_run}/{settings_tag}/norms.png"

# ----------------------------------------------------------------------------- WSD horizons
# <horizon_study> is a study's directory below results/: `horizons` for one size (horizons.size), else
# `horizons/<size>` per size (horizons.sizes); a recipe variant's (horizons.variants) is
# `horizons-<variant>`, `horizons-<variant>/<size>`. <horizon_seed> is a trunk's runtime.seed; <horizon> names
# a branch by its tokens per parameter (h20, h0.1).
HORIZONS_TRUNK_DIR = "results/{horizon_study}/seed{horizon_seed}/trunk"
HORIZONS_TRUNK_RECIPE = "results/{horizon_study}/seed{horizon_seed}/trunk/recipe.yaml"
HORIZONS_TRUNK_STOPPED = "results/{horizon_study}/seed{horizon_seed}/trunk/stopped.json"
HORIZONS_BRANCH_DIR = "results/{horizon_study}/seed{horizon_seed}/{horizon}"
HORIZONS_BRANCH_RECIPE = "results/{horizon_study}/seed{horizon_seed}/{horizon}/recipe.yaml"
HORIZONS_BRANCH_RESULT = "results/{horizon_study}/seed{horizon_seed}/{horizon}/result.json"
HORIZONS_TABLE = "results/report/horizons/report.md"
HORIZONS_SUMMARY = "results/report/horizons/horizons.json"
HORIZONS_PLOT = "results/report/horizons/loss-vs-horizon.png"

# ----------------------------------------------------------------------------- noise study
# <noise_run> is <size>-<source>-s<seed>: source init (runtime.seed varies), data (training.data_seed), both.
NOISE_RUN_DIR = "results/noise/{noise_run}"
NOISE_RECIPE = "results/noise/{noise_run}/recipe.yaml"
NOISE_RESULT = "results/noise/{noise_run}/result.json"
NOISE_TABLE = "results/report/noise/report.md"
NOISE_SUMMARY = "results/report/noise/noise.json"
NOISE_PLOT = "results/report/noise/noise.png"
# ----------------------------------------------------------------------------- scaling fit
# The fit of the horizon studies (and fit.runs), the prediction it makes for fit.verify, that run, and the
# report (fitted curves, isoFLOP curves, predicted against realised).
FIT_JSON = "results/fit/fit.json"
FIT_PREDICTION = "results/fit/prediction.json"
FIT_VERIFY_DIR = "results/fit/verify"
FIT_VERIFY_RECIPE = "results/fit/verify/recipe.yaml"
FIT_VERIFY_RESULT = "results/fit/verify/result.json"
FIT_TABLE = "results/report/fit/report.md"
FIT_TABLE_HTML = "results/report/fit/fit.html"
FIT_CURVES = "results/report/fit/loss-fit.png"
FIT_ISOFLOP = "results/report/fit/isoflop.png"
FIT_SUMMARY = "results/report/fit/summary.json"

# ----------------------------------------------------------------------------- the HTML report's front page
REPORT_SUMMARY = "results/report/summary.rst"

# ----------------------------------------------------------------------------- throughput map
# <context> is model.context_length, <micro> the microbatch, <trial> first or confirm (an OOM's rerun).
THROUGHPUT_RECIPE = "results/throughput/{size}/recipe.yaml"
THROUGHPUT_POINT = "results/throughput/{size}/ctx{context}/m{micro}-{trial}.json"
THROUGHPUT_SUMMARY = "results/throughput/summary.json"
THROUGHPUT_TABLE = "results/throughput/throughput.md"
THROUGHPUT_PLOT = "results/throughput/throughput.png"


@dataclass(frozen=True)
class RunsReport:
    """The files `tiny_llm report` writes for a set of runs (a table, the curves, the comparison)."""

    table: str
    table_html: str
    comparison: str
    curves: str

    def first_look(self) -> list[str]:
        """The files a user opens first."""
        return [self.table, self.curves]

    def targets(self) -> list[str]:
        return [self.table, self.comparison, self.curves]


RUNS_REPORT = RunsReport(
    table="results/report/runs/report.md",
    table_html="results/report/runs/table.html",
    comparison="results/report/runs/comparison.json",
    curves="results/report/runs/learning-curves.png",
)
PACKED_REPORT = RunsReport(
    table="results/report/packed/report.md",
    table_html="results/report/packed/table.html",
    comparison="results/report/packed/comparison.json",
    curves="results/report/packed/learning-curves.png",
)


# ----------------------------------------------------------------------------- campaign (under its root)
@dataclass(frozen=True)
class CampaignLayout:
    """The campaign's files; each pattern holds ``{campaign}``, the campaign's root directory."""

    settings: str = "{campaign}/settings.json"
    record: str = "{campaign}/campaign.json"
    template: str = "{campaign}/templates/{size}.yaml"
    run_dir: str = "{campaign}/{stage}/{run}"
    recipe: str = "{campaign}/{stage}/{run}/recipe.yaml"
    result: str = "{campaign}/{stage}/{run}/result.json"
    ranking: str = "{campaign}/{stage}/ranking.json"
    tie_round: str = "{campaign}/{stage}/ties/round-{round}.json"
    selected: str = "{campaign}/report/selected-{size}.yaml"
    report_table: str = "{campaign}/report/report.md"
    report_table_html: str = "{campaign}/report/table.html"
    report_comparison: str = "{campaign}/report/comparison.json"
    report_curves: str = "{campaign}/report/learning-curves.png"
    intervals: str = "{campaign}/report/intervals.png"

    def under(self, root: str) -> CampaignLayout:
        """The same patterns with the root filled in (the other wildcards kept)."""
        return CampaignLayout(**{f.name: fill(getattr(self, f.name), campaign=root) for f in fields(self)})

    @property
    def report(self) -> RunsReport:
        return RunsReport(
            self.report_table, self.report_table_html, self.report_comparison, self.report_curves
        )


CAMPAIGN = CampaignLayout()

_WILDCARD = re.compile(r"\{(\w+)\}")


def wildcards(pattern: str) -> list[str]:
    """The wildcard names of a pattern, in order."""
    return _WILDCARD.findall(pattern)


def fill(pattern: str, **values: Any) -> str:
    """``pattern`` with the named wildcards filled in; wildcards not named are kept for Snakemake."""
    return _WILDCARD.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], pattern)


def patterns() -> dict[str, str]:
    """Every pattern of the layout by name (for tests and documentation)."""
    table = {name: value for name, value in globals().items() if name.isupper() and isinstance(value, str)}
    for name, report in (("RUNS_REPORT", RUNS_REPORT), ("PACKED_REPORT", PACKED_REPORT)):
        table.update({f"{name}.{f.name}": getattr(report, f.name) for f in fields(report)})
    table.update({f"CAMPAIGN.{f.name}": getattr(CAMPAIGN, f.name) for f in fields(CAMPAIGN)})
    return table
