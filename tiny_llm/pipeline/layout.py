"""Where the workflow puts things under results/ (the README's table describes the same layout)."""

from __future__ import annotations

CORPUS_DIR = "results/data/corpus"
TOKENIZER_DIR = "results/data/tokenizer"
PREPARE_RECIPE = "results/data/prepare.yaml"
RUNS_DIR = "results/runs"
RUNS_REPORT_DIR = "results/report/runs"
PACKED_DIR = "results/packed"
PACKED_BENCH_DIR = "results/packed-benchmarks"
PACKED_REPORT_DIR = "results/report/packed"
RECIPE_FILE = "recipe.yaml"


def tuning_dir(profile: str) -> str:
    return f"results/{profile}-tuning"


def tuning_selected(profile: str) -> str:
    return f"{tuning_dir(profile)}/selected.yaml"


def job_dir(root: str, job: str) -> str:
    return f"{root}/{job}"


def job_recipe(root: str, job: str) -> str:
    return f"{root}/{job}/{RECIPE_FILE}"


def job_result(root: str, job: str) -> str:
    return f"{root}/{job}/result.json"


def cache_manifest(cache_dir: str) -> str:
    """The token cache's manifest.json, written last when the cache is published: what rules depend on."""
    return f"{cache_dir.rstrip('/')}/manifest.json"
