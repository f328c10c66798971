"""Helpers for the workflow-plan tests: the shipped configs, a tiny config and a plan built from them."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from tiny_llm.pipeline import build_plan, load_schema

REPO = Path(__file__).resolve().parents[2]
SCHEMA = load_schema(REPO / "schemas/workflow_config.schema.yaml")


def shipped(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text(encoding="utf-8"))


def plan_of(config: dict, check_files: bool = False):
    return build_plan(copy.deepcopy(config), SCHEMA, "test.yaml", numerics_version=1, check_files=check_files)


def tiny(**extra) -> dict:
    config = {
        "sizes": {"tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}},
        "runs": {"a": {"size": "tiny"}},
    }
    config.update(extra)
    return config
