# Helpers shared by every stage: workflow-config validation, recipe arguments for `python -m tiny_llm`,
# per-size resources, the token-cache budget and the registry of default targets.
# Functions only; the stage files hold the rules. Nothing here imports torch (parsing and `-n` stay fast).

import copy
import difflib
import functools
import json
import shlex
from collections.abc import Callable
from pathlib import Path

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, deep_merge, read_config_source, recipe_from_dict
from tiny_llm.errors import ConfigError

# Bump when a library change is meant to change training results: training rules carry it as a param, so a
# bump reruns them, while ordinary code edits leave finished runs alone.
NUMERICS_VERSION = 1

CORPUS_DIR = "results/data/corpus"
TOKENIZER_DIR = "results/data/tokenizer"
RUNS_DIR = "results/runs"
RUNS_REPORT_DIR = "results/report/runs"

# Recipe fields every size must share, because one token cache serves them all.
CACHE_FIELDS = (
    "dataset",
    "dataset_revision",
    "tokenizer",
    "tokenizer_revision",
    "shuffle_seed",
    "shuffle_buffer",
)


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9._-]*",


# ----------------------------------------------------------------------------- workflow config


def validate_workflow_config(config: dict, schema_file: str) -> None:
    """Reject unknown keys and wrong types with one line each, then fill the schema's defaults."""
    text = (Path(workflow.basedir) / schema_file).read_text(encoding="utf-8")
    schema = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        sources = ", ".join(map(str, workflow.configfiles)) or "the workflow config"
        lines = "\n  ".join(_schema_problem(error) for error in errors)
        raise WorkflowError(f"invalid workflow config ({sources}):\n  {lines}")
    validate(config, str(Path(workflow.basedir) / schema_file))
    _check_sizes_and_runs(config)


def _schema_problem(error: jsonschema.ValidationError) -> str:
    where = ".".join(map(str, error.absolute_path)) or "(top level)"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = [key for key in error.instance if key not in allowed]
        hints = []
        for key in unknown:
            match = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{match[0]}'?" if match else f"allowed: {', '.join(allowed)}"
            hints.append(f"{where}: unknown key '{key}' ({hint})")
        return "; ".join(hints)
    return f"{where}: {error.message}"


def _check_sizes_and_runs(config: dict) -> None:
    for name in config["sizes"]:
        size_recipe(name)
    for run, spec in config["runs"].items():
        if spec["size"] not in config["sizes"]:
            raise WorkflowError(
                f"runs.{run}.size: unknown size '{spec['size']}'; "
                f"sizes: {', '.join(config['sizes']) or 'none'}"
            )
        register_recipe(load_size_recipe(spec["size"], spec["overrides"], where=f"runs.{run}"))
    _check_one_cache(config)


def _check_one_cache(config: dict) -> None:
    sizes = list(config["sizes"])
    if not sizes:
        return
    first = size_recipe(sizes[0])
    for name in sizes[1:]:
        other = size_recipe(name)
        if other.model.vocab_size != first.model.vocab_size:
            raise WorkflowError(
                f"sizes.{name}: model.vocab_size {other.model.vocab_size} differs from size '{sizes[0]}' "
                f"({first.model.vocab_size}); all sizes share one tokenizer and token cache"
            )
        for field in CACHE_FIELDS:
            if getattr(other.data, field) != getattr(first.data, field):
                raise WorkflowError(
                    f"sizes.{name}: data.{field} differs from size '{sizes[0]}'; "
                    "all sizes share one token cache"
                )
    if config["data"]["tokenizer"] == "train" and not is_local_corpus():
        raise WorkflowError(
            "data.tokenizer: 'train' needs the embedded corpus or a local corpus directory; "
            "for a hub corpus name a hub or local tokenizer"
        )


# ----------------------------------------------------------------------------- data locations


def is_local_corpus() -> bool:
    corpus = config["data"]["corpus"]
    return corpus == "embedded" or Path(corpus).is_dir()


def corpus_dataset() -> str:
    """data.dataset of every recipe: the built demo corpus, a local directory or a hub id."""
    corpus = config["data"]["corpus"]
    return CORPUS_DIR if corpus == "embedded" else corpus


def tokenizer_location() -> str:
    tokenizer = config["data"]["tokenizer"]
    return TOKENIZER_DIR if tokenizer == "train" else tokenizer


def cache_dir() -> str:
    return config["data"]["cache_dir"]


def data_overrides() -> dict:
    """The data.* recipe keys the workflow decides for every recipe (one corpus, tokenizer and cache)."""
    data = config["data"]
    return {
        "data": {
            "dataset": corpus_dataset(),
            "dataset_revision": data["corpus_revision"],
            "tokenizer": tokenizer_location(),
            "tokenizer_revision": data["tokenizer_revision"],
            "cache_dir": cache_dir(),
            "prepare_validation_tokens": data["prepare_validation_tokens"],
        }
    }


def prepare_inputs(wildcards) -> dict[str, str]:
    """Rule outputs the cache depends on (nothing for hub corpora and hub tokenizers)."""
    inputs = {}
    if config["data"]["corpus"] == "embedded":
        inputs["corpus"] = CORPUS_DIR
    if config["data"]["tokenizer"] == "train":
        inputs["tokenizer"] = TOKENIZER_DIR
    return inputs


def tokenizer_vocab_size() -> int:
    sizes = list(config["sizes"])
    if not sizes:
        raise WorkflowError("data.tokenizer: 'train' needs an entry in sizes (for model.vocab_size)")
    return size_recipe(sizes[0]).model.vocab_size


# ----------------------------------------------------------------------------- recipes


def flatten(mapping: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Nested mapping -> [(dotted.key, leaf value)]; lists and empty mappings are leaves."""
    items = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            items += flatten(value, f"{prefix}{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def set_value(value: object) -> str:
    """A --set value the library parses back to ``value`` (YAML): plain strings stay bare, others JSON."""
    if isinstance(value, str) and _reads_back(value):
        return value
    return json.dumps(value)


@functools.lru_cache(maxsize=None)
def _reads_back(text: str) -> bool:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return text.strip() == text and yaml.load(text, Loader=loader) == text


def size_overrides(size: str, overrides: dict | None = None) -> dict:
    """recipe_defaults <- the size's overrides <- ``overrides`` <- the workflow's data settings."""
    merged = deep_merge(config["recipe_defaults"], config["sizes"][size]["overrides"])
    return deep_merge(deep_merge(merged, overrides or {}), data_overrides())


def recipe_args(size: str, overrides: dict | None = None, configs: tuple[str, ...] = ()) -> str:
    """`--config PRESET [--config FILE ...] --set key=value ...` for a recipe of ``size`` (shell-quoted).

    Values the library's YAML parsing would misread (numbers-as-strings, null...) are written as JSON.
    """
    parts = ["--config", config["sizes"][size]["preset"]]
    for extra in configs:
        parts += ["--config", extra]
    for key, value in flatten(size_overrides(size, overrides)):
        parts += ["--set", f"{key}={set_value(value)}"]
    return " ".join(shlex.quote(part) for part in parts)


def load_size_recipe(size: str, overrides: dict | None = None, where: str | None = None) -> RecipeConfig:
    """The validated recipe `recipe_args(size, overrides)` describes (the merge the CLI performs)."""
    try:
        preset = preset_dict(config["sizes"][size]["preset"])
        return recipe_from_dict(deep_merge(preset, size_overrides(size, overrides)))
    except ConfigError as exc:
        raise WorkflowError(f"{where or f'sizes.{size}'}: {exc}") from None


_PRESETS: dict[str, dict] = {}


def preset_dict(source: str) -> dict:
    """A preset name or recipe YAML path as a mapping (read once per parse; a fresh copy each call)."""
    if source not in _PRESETS:
        _PRESETS[source] = read_config_source(source)
    return copy.deepcopy(_PRESETS[source])


_SIZE_RECIPES: dict[str, RecipeConfig] = {}


def size_recipe(size: str) -> RecipeConfig:
    if size not in _SIZE_RECIPES:
        _SIZE_RECIPES[size] = load_size_recipe(size)
    return _SIZE_RECIPES[size]


# ----------------------------------------------------------------------------- token cache budget

_CACHE_NEEDS: list[int] = []


def register_recipe(recipe: RecipeConfig) -> None:
    """Make the shared token cache large enough for ``recipe`` (stages call this per declared run)."""
    _CACHE_NEEDS.append(make_budget(recipe).cache_tokens_needed)


def prepare_args(wildcards) -> str:
    """Recipe of the cache: the first size's settings, train tokens for the largest registered budget."""
    sizes = list(config["sizes"])
    if not sizes:
        raise WorkflowError("sizes: empty; the token cache is prepared for the sizes' recipes, define one")
    need = max(_CACHE_NEEDS + [make_budget(size_recipe(name)).cache_tokens_needed for name in sizes])
    return recipe_args(sizes[0], {"data": {"prepare_train_tokens": need}})


# ----------------------------------------------------------------------------- resources


def uses_gpu(size: str) -> bool:
    return size_recipe(size).runtime.device != "cpu"


def size_resources(size_of: Callable) -> dict[str, Callable]:
    """gpu, mem_mb, runtime (minutes x attempt) of a job training a ``size_of(wildcards)`` model."""

    def gpu(wildcards) -> int:
        return int(uses_gpu(size_of(wildcards)))

    def mem_mb(wildcards, attempt) -> int:
        return config["sizes"][size_of(wildcards)]["mem_mb"]

    def runtime(wildcards, attempt) -> int:
        return config["sizes"][size_of(wildcards)]["runtime_minutes"] * attempt

    return {"gpu": gpu, "mem_mb": mem_mb, "runtime": runtime}


def size_threads(size_of: Callable) -> Callable:
    def threads(wildcards) -> int:
        return config["sizes"][size_of(wildcards)]["threads"]

    return threads


def prepare_runtime(wildcards, attempt) -> int:
    """Minutes for prepare: the demo takes seconds, the full C4 prefix hours when streamed."""
    return (30 if is_local_corpus() else 480) * attempt


# ----------------------------------------------------------------------------- plain runs


def run_size(wildcards) -> str:
    return config["runs"][wildcards.run]["size"]


def run_recipe_args(wildcards) -> str:
    run = config["runs"][wildcards.run]
    return recipe_args(run["size"], run["overrides"])


def run_dir(wildcards) -> str:
    return f"{RUNS_DIR}/{wildcards.run}"


def runs_root(wildcards) -> str:
    return RUNS_DIR


def output_parent(wildcards, output) -> str:
    """Directory of a rule's first output (for commands that take an output directory)."""
    return str(Path(output[0]).parent)


def run_evaluate_flags(wildcards) -> str:
    return "--full" if config["runs"][wildcards.run]["evaluate_full"] else ""


def run_results() -> list[str]:
    return [f"{RUNS_DIR}/{run}/result.json" for run in config["runs"]]


def run_evaluations() -> list[str]:
    return [f"{RUNS_DIR}/{run}/evaluation.json" for run in config["runs"]]


# ----------------------------------------------------------------------------- targets

_STAGE_TARGETS: dict[str, list[str]] = {}


def register_stage(name: str, targets: list[str], enabled: bool = True) -> None:
    """Add a stage's final files to the default target (`snakemake` with no target) when enabled."""
    _STAGE_TARGETS[name] = list(targets) if enabled else []


def stage_targets(name: str) -> list[str]:
    return _STAGE_TARGETS.get(name, [])


def default_targets() -> list[str]:
    return [target for targets in _STAGE_TARGETS.values() for target in targets]

