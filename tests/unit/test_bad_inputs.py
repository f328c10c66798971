"""Inputs a user gets wrong get one line naming the key or file and what to do: a leading ``~``, a missing
local corpus, corpus shards that are not UTF-8 or empty, a templated config YAML cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_helpers import plan_of, tiny

from tiny_llm.config import load_recipe
from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir
from tiny_llm.errors import ConfigError

# ------------------------------------------------------------------ ~ is the home directory


def test_a_tilde_in_the_run_and_cache_directories_is_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    recipe = load_recipe(["tiny"], ["runtime.output_dir=~/runs/a", "data.cache_dir=~/cache"])
    assert recipe.runtime.output_dir == str(tmp_path / "home" / "runs" / "a")
    assert recipe.data.cache_dir == str(tmp_path / "home" / "cache")


def test_the_workflow_expands_a_tilde_in_its_corpus_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    train, validation = split_documents(demo_documents(20_000), 0.1)
    write_c4_dir(home / "corpus", train, validation)
    plan = plan_of(tiny(data={"corpus": "~/corpus", "tokenizer": "train", "cache_dir": "~/cache"}))
    assert plan.data.cache_manifest == f"{home}/cache/manifest.json"
    assert plan.book.is_local_corpus() and plan.book.corpus_dataset() == str(home / "corpus")
    recipe = plan.book.size_recipe("tiny")
    assert recipe.data.dataset == str(home / "corpus") and recipe.data.cache_dir == str(home / "cache")


def test_a_missing_local_corpus_is_a_corpus_problem_not_a_tokenizer_one(tmp_path: Path) -> None:
    missing = tmp_path / "my-c4"
    with pytest.raises(ConfigError) as err:
        plan_of(tiny(data={"corpus": str(missing), "tokenizer": "train"}))
    assert str(err.value) == (
        f"data.corpus: directory {missing} not found (a local corpus is a directory in C4's layout; a hub "
        "corpus is named owner/name); fix the path"
    )
