"""`data.prepare_workers`: tokenizing in worker processes writes the same cache, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from data_helpers import FirstBatchLast

from tiny_llm.config import load_recipe, recipe_identity
from tiny_llm.data import prepare
from tiny_llm.data.prepare import prepare_cache

# Small batches and shards: many batches in flight across the workers, several shards per split.
SETS = [
    "data.prepare_train_tokens=40000",
    "data.tokenize_batch_size=16",
    "data.shard_tokens=16384",
]


def files(cache: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cache)): p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}


def test_one_and_three_workers_write_identical_caches(
    tmp_path: Path, tiny_recipe_args: Callable[[Path], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers, the first batch deliberately finished after the second: the same bytes as one."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setattr(prepare, "_encode_in_worker", FirstBatchLast(marks))
    caches = {}
    for workers in (1, 3):
        cache = tmp_path / f"workers-{workers}"
        recipe = load_recipe(["tiny"], [*tiny_recipe_args(cache), *SETS, f"data.prepare_workers={workers}"])
        assert not prepare_cache(recipe, progress=False).reused
        caches[workers] = files(cache)
    assert (marks / "0").read_text() == "after 1"  # the workers did finish out of order
    one, three = caches[1], caches[3]
    # The worker count is an execution setting: neither the cache nor a run's identity depends on it.
    plain = load_recipe(["tiny"], [*tiny_recipe_args(tmp_path / "c"), *SETS])
    parallel = load_recipe(["tiny"], [*tiny_recipe_args(tmp_path / "c"), *SETS, "data.prepare_workers=3"])
    assert recipe_identity(plain, "x") == recipe_identity(parallel, "x")
    assert sum(name.startswith("train-") for name in one) == 3  # 16,384 x 2 + 7,232
    # The validation split is read to its end: the workers' last, short batch is written too.
    assert one.keys() == three.keys()
    assert all(one[name] == three[name] for name in one), [n for n in one if one[n] != three[n]]
    assert json.loads(one["manifest.json"])["validation_complete"]
