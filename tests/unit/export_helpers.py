"""Helpers for the export and generation tests: small trained runs and transformers loading."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
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


def saved_by_transformers(export: Path, output: Path) -> Path:
    """The directory transformers' own save_pretrained writes for the export's model and tokenizer."""
    model, tokenizer, _ = load_hf(export)
    model.save_pretrained(str(output))
    tokenizer.save_pretrained(str(output))
    return output


def directory_differences(ours: Path, theirs: Path) -> set[tuple[str, str | None]]:
    """(file, top-level JSON key) pairs that differ; (file, None): a file on one side only, or other bytes."""
    from safetensors import safe_open

    missing = object()
    found: set[tuple[str, str | None]] = set()
    for name in {p.name for p in ours.iterdir()} | {p.name for p in theirs.iterdir()}:
        a, b = ours / name, theirs / name
        if not (a.is_file() and b.is_file()):
            found.add((name, None))
        elif name.endswith(".json"):
            x, y = json.loads(a.read_text()), json.loads(b.read_text())
            found |= {(name, k) for k in x.keys() | y.keys() if x.get(k, missing) != y.get(k, missing)}
        elif name.endswith(".safetensors"):
            with safe_open(str(a), "pt") as fa, safe_open(str(b), "pt") as fb:
                keys = list(fa.keys())
                same = fa.metadata() == fb.metadata() and set(keys) == set(fb.keys())
                same = same and all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in keys)
            if not same:
                found.add((name, None))
        elif a.read_bytes() != b.read_bytes():
            found.add((name, None))
    return found


def documented_differences(backend: str, gguf: bool) -> set[tuple[str, str | None]]:
    from tiny_llm.export.card import differences

    return {(d.file, key) for d in differences(backend, gguf) for key in (d.keys or (None,))}
