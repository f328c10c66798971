"""The workflow plan (torch- and Snakemake-free): what the rules ask about runs, stages, files."""

from tiny_llm.pipeline import layout
from tiny_llm.pipeline.files import write_plan_file
from tiny_llm.pipeline.plan import STAGES, WorkflowPlan, build_plan
from tiny_llm.pipeline.schema import load_schema
from tiny_llm.pipeline.stage import Resources, StagePlan

__all__ = [
    "STAGES",
    "Resources",
    "StagePlan",
    "WorkflowPlan",
    "build_plan",
    "layout",
    "load_schema",
    "write_plan_file",
]
