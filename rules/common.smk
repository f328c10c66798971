# The input and params functions of every stage's rules: each one line that asks the plan (tiny_llm.pipeline,
# built once in the Snakefile). Functions only; the stage files hold the rules.
#
# Plan files (every training job's recipe.yaml, the token cache's recipe, tuning profiles, campaign settings)
# are written by rule write_plan_file, which runs only when a file's content changes (or it is missing). The
# job that reads one takes it as a plain input, so the same call that rewrites a recipe reruns its job (an
# `ancient` input would not: Snakemake never re-checks a job downstream of one that reruns, and a params
# function taking `input` is not a params trigger). The trainer then sets aside a run of another recipe
# identity; a rewritten recipe of the same identity only redoes its final validation from final.pt.

import shlex
import sys
from pathlib import Path

from tiny_llm.errors import TinyLLMError
from tiny_llm.pipeline import (
    CORPUS_DIR,
    PACKED_BENCH_DIR,
    PACKED_DIR,
    PACKED_REPORT_DIR,
    RUNS_DIR,
    RUNS_REPORT_DIR,
    TOKENIZER_DIR,
    tuning_dir,
    write_plan_file,
)
from tiny_llm.pipeline.analysis import ANALYSIS_DIR
from tiny_llm.pipeline.export import EXPORTS_DIR, EXPORTS_REPORT_DIR
from tiny_llm.pipeline.export import PROMPTS_FILE as EXPORT_PROMPTS


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",


def plan_file_content(wildcards) -> dict:
    return PLAN.files.content(wildcards.plan_file)


def words(flags: str) -> list[str]:
    """A plan's option string as arguments, for a shell's `{params.x:q}` (every value is quoted there)."""
    return shlex.split(flags)


def or_exit(ask, *args):
    """The plan's answer; a problem with the request itself ends the run with its one-line message."""
    try:
        return ask(*args)
    except TinyLLMError as exc:
        sys.exit(f"error: {exc}")


def output_parent(wildcards, output) -> str:
    """Directory of a rule's first output (for commands that take an output directory)."""
    return str(Path(output[0]).parent)


def input_parent(wildcards, input) -> str:
    """Directory of a rule's first input (a run directory, from its result.json)."""
    return str(Path(input[0]).parent)


def runs_root(wildcards, input) -> str:
    """The directory holding the run directories of a report's inputs (<root>/<run>/result.json)."""
    return str(Path(input[0]).parents[1])



# ----------------------------------------------------------------------------- data


def prepare_inputs(wildcards) -> dict:
    return {**PLAN.prepare_inputs(), "recipe": PLAN.prepare_recipe()}


def prepare_runtime(wildcards, attempt) -> int:
    return PLAN.prepare_runtime_minutes() * attempt


# ----------------------------------------------------------------------------- plain runs


def run_evaluate_flags(wildcards) -> list[str]:
    return words(PLAN.run_evaluate_flags(wildcards.run))


# ----------------------------------------------------------------------------- tuning


def tuning_profile(wildcards) -> str:
    return PLAN.tuning.profile_file(wildcards.profile)


def candidate_inputs(wildcards) -> dict:
    return PLAN.tuning.candidate_inputs(wildcards.profile, wildcards.slot)


def tuning_results(wildcards) -> str:
    return tuning_dir(wildcards.profile)


def tuning_plan(wildcards) -> str:
    return or_exit(PLAN.tuning.plan_file, wildcards.profile, Path(workflow.basedir) / "config")


def all_candidates(wildcards) -> list[str]:
    return PLAN.tuning.candidates(wildcards.profile)


# ----------------------------------------------------------------------------- campaign


def campaign_plan_inputs(wildcards) -> dict:
    return {"settings": PLAN.campaign.settings_file, **PLAN.campaign.plan_inputs(PLAN.cache_manifest)}


def campaign_stage_number(wildcards) -> int:
    return PLAN.campaign.stage_number(wildcards.stage)


def campaign_stage_results(wildcards) -> list[str]:
    return PLAN.campaign.results(wildcards.stage)


def campaign_parent_results(wildcards) -> list[str]:
    return PLAN.campaign.results(PLAN.campaign.previous(wildcards.stage))


def campaign_parent_recipes(wildcards) -> list:
    return [ancient(path) for path in PLAN.campaign.recipes(PLAN.campaign.previous(wildcards.stage))]


def campaign_template(wildcards):
    return ancient(PLAN.campaign.template(wildcards.stage))


def campaign_root(wildcards, output) -> str:
    return PLAN.campaign.root


def campaign_thread_flags(wildcards, threads) -> list[str]:
    return words(PLAN.campaign.thread_flags(wildcards.run, threads))


# ----------------------------------------------------------------------------- export


def export_ranking(wildcards) -> str:
    return PLAN.export.ranking(wildcards.size)


# ----------------------------------------------------------------------------- analysis


def analysed_run_ready(wildcards) -> str:
    return PLAN.analysis.runs[wildcards.aname].ready


def analysed_run_source(wildcards) -> list[str]:
    run = PLAN.analysis.runs[wildcards.aname]
    return ["--best-of", run.ranking] if run.ranking else ["--run", run.run_dir]  # paths may hold spaces


def analysis_flags(wildcards) -> list[str]:
    return words(PLAN.analysis.flags(wildcards.case))


def analysis_jobs(wildcards) -> list[str]:
    return PLAN.analysis.jobs(wildcards.aname)


def analysis_metrics(wildcards) -> list[str]:
    run_dir = PLAN.analysis.runs[wildcards.aname].run_dir
    return ["--metrics", f"{run_dir}/metrics.jsonl"] if run_dir else []
