"""The workflow plan (torch- and Snakemake-free): what the rules ask about runs, stages, files."""

from tiny_llm.pipeline.files import write_plan_file
from tiny_llm.pipeline.layout import (
    CORPUS_DIR,
    PACKED_BENCH_DIR,
    PACKED_DIR,
    PACKED_REPORT_DIR,
    PREPARE_RECIPE,
    RUNS_DIR,
    RUNS_REPORT_DIR,
    TOKENIZER_DIR,
    tuning_dir,
)
from tiny_llm.pipeline.plan import STAGES, Resources, WorkflowPlan, build_plan
from tiny_llm.pipeline.schema import load_schema

__all__ = [
    "CORPUS_DIR",
    "PACKED_BENCH_DIR",
    "PACKED_DIR",
    "PACKED_REPORT_DIR",
    "PREPARE_RECIPE",
    "RUNS_DIR",
    "RUNS_REPORT_DIR",
    "STAGES",
    "TOKENIZER_DIR",
    "Resources",
    "WorkflowPlan",
    "build_plan",
    "load_schema",
    "tuning_dir",
    "write_plan_file",
]
