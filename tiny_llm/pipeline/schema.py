"""Workflow-config validation against its JSON schema: one line per problem, then the schema's defaults."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tiny_llm.errors import ConfigError
from tiny_llm.io import LongIntegerError, parse_yaml
from tiny_llm.typed import MAX_INTEGER, did_you_mean, number_from_text, show_number


def load_schema(schema_file: str | Path) -> dict[str, Any]:
    text = Path(schema_file).read_text(encoding="utf-8")
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def refuse_long_integers(config_file: str | Path) -> None:
    """Refuse, in one line naming its key, a workflow config holding an integer longer than Python reads,
    before Snakemake reads it (its reading would end in a ValueError traceback)."""
    try:
        parse_yaml(Path(config_file).read_text(encoding="utf-8"))
    except LongIntegerError as exc:
        raise ConfigError(f"{config_file}: {exc}") from None
    except (OSError, ValueError, yaml.YAMLError):
        return  # Snakemake says what is wrong with it


def refuse_templates(config_files: Iterable[str | Path]) -> None:
    """Refuse a workflow config that asks for Snakemake's YAML templates (``__use_yte__: true``).

    Snakemake evaluates such a file's Python expressions when it reads it, and drops the key before the
    schema sees the config: so look at the files themselves. This stops the run; the code already ran. The
    file is composed, not constructed: a tag that only a template's loader takes (``!!python/tuple``) hides
    nothing.
    """
    for path in config_files:
        try:
            document = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not YAML at all: Snakemake itself said what is wrong with it
        keys = document.value if isinstance(document, yaml.MappingNode) else []
        if any(isinstance(key, yaml.ScalarNode) and key.value == "__use_yte__" for key, _ in keys):
            raise ConfigError(
                f"{path}: __use_yte__ (Snakemake's YAML templates, which run Python) is not allowed in a "
                "workflow config; remove the key and write the values out"
            )


def validate_config(config: dict[str, Any], schema: dict[str, Any], sources: str) -> None:
    """Reject unknown keys and wrong types (every problem, one line each), then fill the defaults in place."""
    coerce_numbers(config, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    problems = [schema_problem(error) for error in errors] + non_finite_numbers(config)
    if problems:
        lines = "\n  ".join(problems)
        raise ConfigError(f"invalid workflow config ({sources or 'the workflow config'}):\n  {lines}")
    fill_defaults(config, schema)


def non_finite_numbers(instance: Any, where: str = "") -> list[str]:
    """``key: NaN/infinity ...`` for every NaN or infinite number (JSON has none; YAML's .nan/.inf do), and
    for every integer of 2**63 or more in size (no setting counts that far: a typo)."""
    if isinstance(instance, float) and not math.isfinite(instance):
        return [f"{where or '(top level)'}: {instance} is not a finite number"]
    if isinstance(instance, int) and abs(instance) >= MAX_INTEGER:
        return [f"{where or '(top level)'}: must be below 2**63 in size, got {show_number(instance)}"]
    items: Iterable[tuple[Any, Any]]
    if isinstance(instance, dict):
        items = instance.items()
    elif isinstance(instance, list):
        items = enumerate(instance)
    else:
        return []
    return [
        p for key, value in items for p in non_finite_numbers(value, f"{where}.{key}" if where else str(key))
    ]


def schema_problem(error: jsonschema.ValidationError) -> str:
    """One line naming the key; an unknown key gets the closest valid name."""
    where = ".".join(map(str, error.absolute_path)) or "(top level)"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        hints = []
        for key in (key for key in error.instance if key not in allowed):
            hints.append(f"{where}: unknown key '{key}'{did_you_mean(str(key), allowed)}")
        return "; ".join(hints)
    return f"{where}: {error.message}"


def coerce_numbers(instance: Any, schema: dict[str, Any]) -> Any:
    """Numbers as YAML 1.1 reads them (1e-3 is a string there) become numbers where the schema expects one;
    other strings stay strings, and recipe overrides are converted by the recipe's own validation."""
    if isinstance(instance, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else {})
            instance[key] = coerce_numbers(value, sub)
        return instance
    if isinstance(instance, list):
        raw_items = schema.get("items")
        items: dict[str, Any] = raw_items if isinstance(raw_items, dict) else {}
        for i, value in enumerate(instance):
            instance[i] = coerce_numbers(value, items)
        return instance
    types = schema.get("type") or []
    types = [types] if isinstance(types, str) else types
    return number_from_text(instance) if {"number", "integer"} & set(types) else instance


def fill_defaults(instance: Any, schema: dict[str, Any]) -> None:
    """Set every missing property that has a schema default, recursing into objects and arrays."""
    if isinstance(instance, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in instance and "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                fill_defaults(instance[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in instance.items():
                if key not in (schema.get("properties") or {}):
                    fill_defaults(value, extra)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for item in instance:
            fill_defaults(item, schema["items"])


SCHEMA_PATH = Path("schemas") / "workflow_config.schema.yaml"


def find_schema(config_file: Path) -> Path:
    """The workflow's schema: in the working directory or in a folder above the config file."""
    for folder in (Path.cwd(), *config_file.resolve().parents):
        if (folder / SCHEMA_PATH).is_file():
            return folder / SCHEMA_PATH
    raise ConfigError(f"{SCHEMA_PATH} not found here or above {config_file}; run from the workflow directory")
