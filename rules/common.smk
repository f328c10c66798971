# The input and params functions of every stage's rules: each one line that asks the plan (tiny_llm.pipeline,
# built once in the Snakefile), and the guard that lets one controller at a time run in a directory. Functions
# only; the stage files hold the rules.
#
# Plan files (every training job's recipe.yaml, the token cache's recipe, tuning profiles, campaign settings)
# are written by rule write_plan_file, which runs only when a file's content changes (or it is missing). The
# job that reads one takes it as a plain input, so the same call that rewrites a recipe reruns its job. The
# trainer then sets aside a run of another recipe identity; a rewritten recipe of the same identity only redoes
# its final validation from final.pt.
#
# No input is `ancient`. Snakemake 9 masks every job downstream of one that must run, and reaches a masked job
# only through an edge from a job that runs; an `ancient` edge whose file exists is not followed, so the job
# behind it and everything after it (the target included) is skipped even when its outputs are missing: a
# rerun after a killed controller re-ran the killed `campaign plan` alone and exited 0 with no campaign run
# trained (tests/workflow/test_rerun_complete.py). Every edge here is plain: a job that reruns reruns what
# reads its outputs, and a finished run reached that way only re-finalises (its final validation).

import functools
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import LockException
from snakemake_interface_executor_plugins.settings import ExecMode

from tiny_llm.errors import TinyLLMError
from tiny_llm.io import read_json
from tiny_llm.pipeline import write_plan_file
from tiny_llm.pipeline.files import write_stamp
from tiny_llm.pipeline.summary import write_summary
from tiny_llm.pipeline.controller import become_the_controller, stale_snakemake_lock, unbuilt_files
from tiny_llm.pipeline.layout import (
    ANALYSIS_ALIGNMENT,
    ANALYSIS_JOB,
    ANALYSIS_MANIFEST,
    ANALYSIS_NOISE,
    ANALYSIS_NORMS,
    ANALYSIS_SUMMARY,
    CORPUS_DIR,
    EXPORT_BEST,
    EXPORT_PROMPTS,
    EXPORT_RUN,
    EXPORTS_JSON,
    EXPORTS_MODELS,
    EXPORTS_SAMPLES,
    EXPORTS_TABLE,
    FIT_CURVES,
    FIT_ISOFLOP,
    FIT_JSON,
    FIT_PREDICTION,
    FIT_SUMMARY,
    FIT_TABLE,
    FIT_TABLE_HTML,
    FIT_VERIFY_RECIPE,
    FIT_VERIFY_RESULT,
    HORIZONS_BRANCH_RECIPE,
    HORIZONS_BRANCH_RESULT,
    HORIZONS_PLOT,
    HORIZONS_SUMMARY,
    HORIZONS_TABLE,
    HORIZONS_TRUNK_RECIPE,
    HORIZONS_TRUNK_STOPPED,
    NOISE_PLOT,
    NOISE_RECIPE,
    NOISE_RESULT,
    NOISE_SUMMARY,
    NOISE_TABLE,
    PACKED_BENCH_PLOT,
    PACKED_BENCH_RECIPE,
    PACKED_BENCH_RESULT,
    PACKED_BENCH_SUMMARY,
    PACKED_RECIPE,
    PACKED_REPORT,
    PACKED_RESULT,
    PLAN_STAMP,
    REPORT_SUMMARY,
    RUN_EVALUATION,
    RUN_RECIPE,
    RUN_RESULT,
    RUNS_REPORT,
    THROUGHPUT_PLOT,
    THROUGHPUT_POINT,
    THROUGHPUT_SUMMARY,
    THROUGHPUT_TABLE,
    TOKENIZER_DIR,
    TUNING_CANDIDATE,
    TUNING_PLAN,
    TUNING_PLOT,
    TUNING_SELECTED,
    TUNING_SUMMARY,
)

# The campaign's files: the layout's patterns with the configured campaign directory filled in.
CAMPAIGN_ROOT = PLAN.campaign.root
CAMPAIGN_FILES = PLAN.campaign.paths


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",


def plan_file_content(wildcards) -> dict:
    return PLAN.files.content(wildcards.plan_file)


def plan_file_stamp(wildcards) -> str:
    return PLAN.files.stamp(wildcards.plan_file)


def stamped_plan_file(wildcards) -> str:
    return PLAN.files.stamped(wildcards.plan_stamp)


def plan_file_digests(wildcards, input) -> str:
    """The plan files among a job's inputs and their digests: the job refuses one edited since it was written."""
    return PLAN.files.expected(list(input))


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


# ----------------------------------------------------------------------------- one controller per directory


def one_controller(execute):
    """Snakemake's `execute`, run only by the one controller of this directory: a second one stops with one
    line naming the first, and Snakemake's lock left by a killed one with one line saying to --unlock (its own
    messages are several lines and a traceback). Dry runs, --nolock and the job processes Snakemake starts (on
    Slurm too) take no lock, as in Snakemake; --unlock, --lint and --report never execute."""

    @functools.wraps(execute)
    def execute_alone(**kwargs):
        plugin = kwargs.get("executor_plugin")  # Snakemake 9's keyword; without it, its own lock alone
        dry = plugin is None or plugin.common_settings.dryrun_exec
        if workflow.execution_settings.lock and workflow.exec_mode == ExecMode.DEFAULT and not dry:
            try:
                become_the_controller(Path.cwd())
            except TinyLLMError as exc:
                sys.exit(f"error: {exc}")
        try:
            return execute(**kwargs)
        except LockException:
            sys.exit(f"error: {stale_snakemake_lock(Path.cwd())}")

    return execute_alone


workflow.execute = one_controller(workflow.execute)


def unbuilt_targets() -> list[str]:
    """Files this run's DAG should hold by now and does not (Snakemake can skip a job after a rerun-incomplete
    one: see the header). A run limited by --until, --omit-from or --allowed-rules builds part of it on
    purpose, and --touch builds nothing."""
    settings = workflow.dag_settings
    if settings.until or settings.omit_from or settings.allowed_rules or workflow.touch:
        return []
    return unbuilt_files(workflow.dag.jobs)


# ----------------------------------------------------------------------------- data


def prepare_inputs(wildcards) -> dict:
    return {**PLAN.data.prepare_inputs(), "recipe": PLAN.data.prepare_recipe()}


# ----------------------------------------------------------------------------- plain runs


def run_evaluate_flags(wildcards) -> list[str]:
    return words(or_exit(PLAN.runs.evaluate_flags, wildcards.run))


# ----------------------------------------------------------------------------- tuning


def tuning_profile(wildcards) -> str:
    return PLAN.tuning.profile_file(wildcards.profile)


def candidate_inputs(wildcards) -> dict:
    return PLAN.tuning.candidate_inputs(wildcards.profile, wildcards.slot)


def tuning_results(wildcards) -> str:
    return PLAN.tuning.results_dir(wildcards.profile)


def tuning_schedule(wildcards) -> str:
    return or_exit(PLAN.tuning.schedule_file, wildcards.profile, Path(workflow.basedir) / "config")


def all_candidates(wildcards) -> list[str]:
    return PLAN.tuning.candidates(wildcards.profile)


# ----------------------------------------------------------------------------- campaign


def campaign_plan_inputs(wildcards) -> dict:
    return {"settings": PLAN.campaign.settings_file, **PLAN.campaign.plan_inputs(PLAN.data.cache_manifest)}


def campaign_stage_number(wildcards) -> int:
    return PLAN.campaign.stage_number(wildcards.stage)


def campaign_stage_results(wildcards) -> list[str]:
    return PLAN.campaign.results(wildcards.stage)


def campaign_parent_results(wildcards) -> list[str]:
    return PLAN.campaign.results(PLAN.campaign.previous(wildcards.stage))


def campaign_parent_recipes(wildcards) -> list[str]:
    return PLAN.campaign.recipes(PLAN.campaign.previous(wildcards.stage))


def campaign_template(wildcards) -> str:
    return PLAN.campaign.template(wildcards.stage)


def campaign_root(wildcards, output) -> str:
    return PLAN.campaign.root


def campaign_thread_flags(wildcards, threads) -> list[str]:
    return words(PLAN.campaign.thread_flags(wildcards.run, threads))


def campaign_tie_round(stage, round_) -> str:
    """A decided tie-resolving round's file, read through the checkpoint (the walk stops at one not decided)."""
    return checkpoints.resolve_cut.get(stage=stage, round=round_).output[0]


def campaign_stage_ties(wildcards) -> list[str]:
    return PLAN.campaign.tie_inputs(wildcards.stage, campaign_tie_round)


def campaign_parent_ties(wildcards) -> list[str]:
    return PLAN.campaign.tie_inputs(PLAN.campaign.previous(wildcards.stage), campaign_tie_round)


def campaign_earlier_ties(wildcards) -> list[str]:
    return PLAN.campaign.tie_inputs(wildcards.stage, campaign_tie_round, before=wildcards.round)


def campaign_tie_decision(wildcards) -> str:
    return or_exit(PLAN.campaign.tie_decision, wildcards.stage, wildcards.run)


def campaign_tie_source(wildcards) -> str:
    return or_exit(PLAN.campaign.tie_source, wildcards.stage, wildcards.run)


# ----------------------------------------------------------------------------- export


def export_ranking(wildcards) -> str:
    return or_exit(PLAN.export.ranking, wildcards.size)


# ----------------------------------------------------------------------------- analysis


def analysed_run_ready(wildcards) -> str:
    return or_exit(PLAN.analysis.run, wildcards.analysed_run).ready


def analysed_run_source(wildcards) -> list[str]:
    return PLAN.analysis.run(wildcards.analysed_run).source


def analysis_flags(wildcards) -> list[str]:
    return words(PLAN.analysis.flags(wildcards.case))


def analysis_jobs(wildcards) -> list[str]:
    return or_exit(PLAN.analysis.jobs, wildcards.analysed_run)


def analysis_metrics(wildcards) -> list[str]:
    return PLAN.analysis.run(wildcards.analysed_run).metrics_flag


# ----------------------------------------------------------------------------- horizons


def horizon_branch_state(wildcards) -> str:
    return or_exit(
        PLAN.horizons.branch_state, wildcards.horizon_study, int(wildcards.horizon_seed), wildcards.horizon
    )


def horizon_trunk_flags(wildcards) -> list[str]:
    return words(or_exit(PLAN.horizons.trunk_flags, wildcards.horizon_study))


def input_parents(wildcards, input) -> list[str]:
    """The directories of a rule's inputs (run directories, from their result.json), one argument each."""
    return [str(Path(path).parent) for path in input]


# ----------------------------------------------------------------------------- scaling fit


def fit_targets(wildcards) -> list[str]:
    """The target `fit` (a function: a config without a grid to fit says so only when the fit is asked for)."""
    return or_exit(PLAN.fit.requested_targets)


def fit_law_inputs(wildcards) -> dict:
    return PLAN.fit.law_inputs()


def fit_law_args(wildcards) -> list[str]:
    return PLAN.fit.law_args()


def fit_report_inputs(wildcards) -> dict:
    return PLAN.fit.report_inputs()


def fit_report_args(wildcards) -> list[str]:
    return PLAN.fit.report_args()


# ----------------------------------------------------------------------------- throughput map


def throughput_point_result(size, context, micro, trial) -> dict:
    """A finished point's record, read through the checkpoint (the walk stops at one not yet measured)."""
    point = checkpoints.bench_throughput.get(size=size, context=context, micro=micro, trial=trial)
    return read_json(point.output[0])


def throughput_points(wildcards) -> list[str]:
    return PLAN.throughput.frontier_points(throughput_point_result)


def throughput_point_inputs(wildcards) -> dict:
    return PLAN.throughput.point_inputs(wildcards)
