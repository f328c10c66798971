"""Shared session fixtures: a small real-English C4-format corpus, a 512-token tokenizer, a tiny token cache.

Use them to build a consistent `tiny` recipe::

    def test_something(tiny_cache, tiny_recipe_args):
        recipe = load_recipe(["tiny"], tiny_recipe_args(tiny_cache))          # library
        argv = ["--config", "tiny"] + [a for s in tiny_recipe_args(tiny_cache) for a in ("--set", s)]  # CLI

The cache is prepared once per session and must not be modified by tests (copy it to corrupt it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

# The suite runs several workers and their jobs' multi-threaded ranks on few cores. OpenMP's threads spin at
# every barrier by default, which on an oversubscribed machine burns the cores the other processes wait for:
# the analysis workflow test took 260 s and 232 CPU-s beside two busy processes, 137 s and 76 CPU-s with
# passive waits. Set before anything loads OpenMP; jobs and workers inherit it (results do not depend on it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TINY_CORPUS_CHARS = 600_000
"""News articles plus the first Wikipedia sections: ~260k tokens with the 512-token tokenizer."""
TINY_VALIDATION_FRACTION = 0.1
TINY_VOCAB = 512
TINY_CACHE_TRAIN_TOKENS = 200_000
"""More than the `tiny` / `packed4-tiny` budgets need (~132k), so small overrides still fit."""


# Units of README's `--dist loadgroup`: the Slurm tests run on one worker beside the rest (they mostly wait on
# the cluster's time limits and requeues), and a module whose fixture trains a whole campaign or workflow runs
# on one worker, which then builds that fixture once instead of once per worker.
ONE_WORKER_MODULES = frozenset(
    {"test_campaign_workflow", "test_faults", "test_plan_stamps", "test_rerun_complete", "test_workflow_e2e"}
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "slurm":
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.path.stem in ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n N`) each worker's torch gets its share of the cores: N workers with a thread
    per core each would oversubscribe the machine (the fast tier runs with `-n 2`, README.md)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


@pytest.fixture(scope="session")
def fault_benchmark() -> ModuleType:
    """benchmarks/faults.py as a module (it is a script, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "faults.py"
    spec = importlib.util.spec_from_file_location("faults_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """C4-format dir (c4-train.*.json.gz, c4-validation.*.json.gz) of real English text."""
    from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir

    output = tmp_path_factory.mktemp("tiny-data") / "corpus"
    train, validation = split_documents(demo_documents(TINY_CORPUS_CHARS), TINY_VALIDATION_FRACTION)
    write_c4_dir(output, train, validation)
    return output


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tiny_corpus_dir: Path) -> Path:
    """Byte-level BPE of exactly 512 tokens (preset `tiny`'s vocab), EOS `</s>` = id 2."""
    from tiny_llm.data.sources import resolve_source
    from tiny_llm.data.tokenizer import train_tokenizer

    source = resolve_source(str(tiny_corpus_dir), None)
    texts = (text for batch in source.iter_texts("train", batch_size=256) for text in batch)
    output = tiny_corpus_dir.parent / "tokenizer"
    train_tokenizer(texts, TINY_VOCAB, output)
    return output


@pytest.fixture(scope="session")
def tiny_recipe_args(tiny_corpus_dir: Path, tiny_tokenizer_dir: Path) -> Callable[[Path], list[str]]:
    """``f(cache_dir) -> ["data.dataset=...", "data.tokenizer=...", "data.cache_dir=...", ...]`` (--set)."""

    def args(cache_dir: Path | str) -> list[str]:
        return [
            f"data.dataset={tiny_corpus_dir}",
            f"data.tokenizer={tiny_tokenizer_dir}",
            f"data.cache_dir={cache_dir}",
            f"data.prepare_train_tokens={TINY_CACHE_TRAIN_TOKENS}",
        ]

    return args


@pytest.fixture(scope="session")
def tiny_cache(tiny_corpus_dir: Path, tiny_recipe_args: Callable[[Path], list[str]]) -> Path:
    """A complete token cache for preset `tiny` (200k train tokens in 4 shards, full validation)."""
    from tiny_llm.config import load_recipe
    from tiny_llm.data.prepare import prepare_cache

    cache_dir = tiny_corpus_dir.parent / "cache"
    prepare_cache(load_recipe(["tiny"], tiny_recipe_args(cache_dir)), progress=False)
    return cache_dir
