"""Helpers for the export and generation tests: small trained runs and transformers loading."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from train_helpers import small_recipe

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.engines import run_training

os.environ["HF_HUB_OFFLINE"] = "1"  # everything below loads from local directories only
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

PACKED_SETS = [
    "training.tokens_per_parameter=0.125",
    "training.epoch_tokens_per_parameter=0.0625",
    "evaluation.subset_blocks=16",
    "runtime.cpu_threads=1",
]


def transformers_module():
    """transformers, or a skip where the dev extra is not installed."""
    return pytest.importorskip("transformers")


def train_small(cache: Path, recipe_args: Callable, run_dir: Path, *extra: str) -> RecipeConfig:
    """The deterministic `tiny` run of train_helpers (28 updates, 3 epochs), trained into run_dir."""
    recipe = small_recipe(cache, recipe_args, run_dir, *extra)
    assert run_training(recipe, quiet=True) == 0
    return recipe


def train_packed(cache: Path, recipe_args: Callable, run_dir: Path) -> RecipeConfig:
    """A short `packed4-tiny` run (4 workers) with per-worker weights in node-KKK/."""
    recipe = load_recipe(
        ["packed4-tiny"], [*recipe_args(cache), *PACKED_SETS, f"runtime.output_dir={run_dir}"]
    )
    assert run_training(recipe, quiet=True) == 0
    return recipe


def load_hf(directory: Path, **kwargs):
    """(model, tokenizer, loading info) of an export directory, offline, strict about keys."""
    transformers = transformers_module()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), local_files_only=True, output_loading_info=True, **kwargs
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return model.eval(), tokenizer, info
