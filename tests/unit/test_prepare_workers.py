"""`data.prepare_workers`: tokenizing in worker processes writes the same cache, byte for byte."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from data_helpers import FirstBatchLast

from tiny_llm.cli import main
from tiny_llm.config import load_recipe, recipe_identity
from tiny_llm.data import prepare
from tiny_llm.data.prepare import WORKER_DIED, prepare_cache
from tiny_llm.data.sources import CorpusSource

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


@pytest.mark.slow  # two spawned workers: about 4 s
def test_a_killed_tokenizing_worker_is_one_line_and_nothing_is_published(
    tmp_path: Path, tiny_recipe_args: Callable[[Path], list[str]], monkeypatch, capsys
) -> None:
    """The kernel's out-of-memory killer taking a worker mid-prepare: one line, not BrokenProcessPool's
    traceback, and no cache (nor partial one) left behind.

    Both workers run before the first batch is read: a worker the executor started on demand while it
    cleaned up after the killed one escaped that clean-up, and the executor waited on it for ever."""
    read = CorpusSource.iter_texts
    running_at_first_batch = []

    def killing_after_the_first_batch(self, *args, **kwargs):
        for number, batch in enumerate(read(self, *args, **kwargs)):
            if number == 0:
                running_at_first_batch.append(len(multiprocessing.active_children()))
            if number == 1:
                for worker in multiprocessing.active_children():
                    os.kill(worker.pid, signal.SIGKILL)
            yield batch

    monkeypatch.setattr(CorpusSource, "iter_texts", killing_after_the_first_batch)
    cache = tmp_path / "cache"
    sets = [*tiny_recipe_args(cache), *SETS, "data.prepare_workers=2"]
    argv = ["prepare", "--no-progress", "--config", "tiny", *[a for s in sets for a in ("--set", s)]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {WORKER_DIED}"
    assert running_at_first_batch == [2]
    assert not cache.exists() and not cache.with_name("cache.partial").exists()
