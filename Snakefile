# tiny-llm: corpus -> tokenizer -> token cache -> training runs, tuning, campaign, packed stages -> report.
# `snakemake` with no target runs the embedded offline CPU demo; see README.md for the cluster configuration.
# Every stage's logic lives in the torch-free plan (tiny_llm/pipeline); the rules files hold only rules.
import mimetypes
import os
import shlex
import sys

from snakemake.utils import min_version

from tiny_llm.errors import TinyLLMError
from tiny_llm.pipeline import STAGES, build_plan, load_schema
from tiny_llm.pipeline.controller import (
    closing_lines_on_error,
    interrupt_on_sigterm,
    record_failed_jobs,
    start_fork_server,
    stop_fork_server,
    unbuilt_line,
    where_to_look,
)
from tiny_llm.pipeline.schema import refuse_long_integers, refuse_templates
from tiny_llm.pipeline.timing import closing_time_lines

min_version("9.0")


# The demo config only when no --configfile is given: a --configfile replaces it. Snakemake does not pass
# --replace-workflow-config on to cluster jobs, so merging would give every Slurm job a different config.
if not workflow.overwrite_configfiles:
    try:
        refuse_long_integers("workflow_config.yaml")  # Snakemake's own reading would end in a traceback
    except TinyLLMError as exc:
        sys.exit(f"error: {exc}")

    configfile: "workflow_config.yaml"


report: "report/workflow.rst"


# The HTML report embeds each file with its MIME type; Python < 3.13 does not know YAML (selected-*.yaml).
mimetypes.add_type("application/yaml", ".yaml")


# Bump when a library change is meant to change training results: training rules carry it as a param, so a
# bump reruns them, while ordinary code edits leave finished runs alone.
# 2: WSD to zero as 1 - sqrt(q); fp32 reference attention under autocast; RoPE tables as transformers'.
NUMERICS_VERSION = 2

try:
    refuse_templates(workflow.configfiles)  # a workflow config is code, like this file: no templates on top
    PLAN = build_plan(
        config,
        load_schema(f"{workflow.basedir}/schemas/workflow_config.schema.yaml"),
        sources=", ".join(map(str, workflow.configfiles)),
        numerics_version=NUMERICS_VERSION,
        # a local run's cores, which a timed job takes all of (None on a cluster, where each job is its own
        # allocation); asked when jobs are planned, since the executor is unknown while this file is parsed
        local_cores=lambda: workflow.cores if workflow.local_exec else None,
    )
except TinyLLMError as exc:
    sys.exit(f"error: {exc}")  # the message alone: a traceback adds nothing a user can act on

# Live tracking (the config's `tracking` section) reaches every training job through its environment.
os.environ.update(PLAN.tracking_env)


# One compile cache for every job (the library checks it is private; tiny_llm/runtime/compile_cache.py). A
# prefix replaces Snakemake's own `set -euo pipefail; `, which stays first: a failing command before a pipe
# (`campaign plan ... | tee`) then fails its job instead of passing as tee's exit status.
COMPILE_CACHE = os.path.abspath(os.path.expanduser(config["compile_cache"]))  # ~ is the home directory
shell.prefix(f"set -euo pipefail; export TINY_LLM_COMPILE_CACHE={shlex.quote(COMPILE_CACHE)}; ")


# A local run of a GPU configuration gets one GPU at a time unless `--resources gpu=N` says how many (each job
# then takes a free one); a CPU configuration announces no GPU. No --jobs means a local run (a cluster needs it).
if PLAN.uses_gpu() and workflow.nodes is None and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", 1)


include: "rules/common.smk"
include: "rules/plan_files.smk"
include: "rules/data.smk"
include: "rules/runs.smk"
include: "rules/tuning.smk"
include: "rules/campaign.smk"
include: "rules/packed.smk"
include: "rules/export.smk"
include: "rules/analysis.smk"
include: "rules/horizons.smk"
include: "rules/noise.smk"
include: "rules/fit.smk"
include: "rules/throughput.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        [PLAN.default_targets(stage) for stage in STAGES],
        PLAN.stamps(),
        REPORT_SUMMARY,


rule data:
    input:
        PLAN.targets("data"),
        PLAN.stamps("data"),


rule runs:
    input:
        PLAN.targets("runs"),
        PLAN.stamps("runs"),


rule tuning:
    input:
        PLAN.targets("tuning"),
        PLAN.stamps("tuning"),


rule campaign:
    input:
        PLAN.targets("campaign"),
        PLAN.stamps("campaign"),


rule packed:
    input:
        PLAN.targets("packed"),
        PLAN.stamps("packed"),


rule export:
    input:
        PLAN.targets("export"),
        PLAN.stamps("export"),


rule analysis:
    input:
        PLAN.targets("analysis"),
        PLAN.stamps("analysis"),


rule horizons:
    input:
        PLAN.targets("horizons"),
        PLAN.stamps("horizons"),


rule noise:
    input:
        PLAN.targets("noise"),
        PLAN.stamps("noise"),


rule fit:
    input:
        fit_targets,
        PLAN.stamps("fit"),


rule throughput:
    input:
        PLAN.targets("throughput"),
        PLAN.stamps("throughput"),


onstart:
    # after Snakemake's scheduler installed its own handler, which would wait for every running job to finish
    interrupt_on_sigterm(forward_to_jobs=workflow.local_exec)
    record_failed_jobs()  # for the closing lines, whatever the console's quietness hides
    if workflow.local_exec and config["shared_startup"]:  # a cluster job is its own allocation
        start_fork_server("logs/fork-server.jsonl")


onsuccess:
    stop_fork_server()
    # exit 0 means built: a run that left a target's file unbuilt says so and fails (rules/common.smk)
    if unbuilt := unbuilt_targets():
        sys.exit(f"\n{unbuilt_line(unbuilt)}")
    if where_to_look(PLAN):
        print("\nResults (the full table is in README.md, 'What the demo does'):")
        print("\n".join(where_to_look(PLAN)))
        print("HTML report with every table and plot: snakemake --report report.html")
    if PLAN.throughput.unmeasured_lines():  # a failed point is a result, not a failed job: say so here
        print("\n" + "\n".join(PLAN.throughput.unmeasured_lines()))
    # this run's wall time and its longest stages, from its jobs' benchmark files (logs/<rule>/*.tsv)
    print("\n" + "\n".join(closing_time_lines(workflow.start_time, workflow.basedir)))


onerror:
    stop_fork_server()
    print("\n" + "\n".join(closing_lines_on_error(log) + PLAN.throughput.unmeasured_lines()))
