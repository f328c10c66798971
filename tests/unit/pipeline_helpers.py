"""Helpers for the workflow-plan tests: the shipped configs, a tiny config and a plan built from them."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.pipeline import build_plan, load_schema

REPO = Path(__file__).resolve().parents[2]
SCHEMA = load_schema(REPO / "schemas/workflow_config.schema.yaml")


def shipped(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text(encoding="utf-8"))


def plan_of(config: dict):
    return build_plan(copy.deepcopy(config), SCHEMA, "test.yaml", numerics_version=1, precheck_campaign=False)


def tiny(**extra) -> dict:
    config = {
        "sizes": {"tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}},
        "runs": {"a": {"size": "tiny"}},
    }
    config.update(extra)
    return config


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mapping -> [(dotted.key, leaf value)]; lists and empty mappings are leaves."""
    items: list[tuple[str, Any]] = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            items += flatten(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def set_value(value: Any) -> str:
    """A --set value the library's YAML parsing reads back as ``value``: plain strings bare, others JSON."""
    if isinstance(value, str) and value.strip() == value and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)
