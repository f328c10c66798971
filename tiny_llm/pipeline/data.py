"""The data stage's part of the plan: corpus, tokenizer and the one token cache every job trains on."""

from __future__ import annotations

from typing import Any

from tiny_llm.budget import make_budget
from tiny_llm.config import recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles
from tiny_llm.pipeline.layout import CORPUS_DIR, PREPARE_RECIPE, TOKENIZER_DIR
from tiny_llm.pipeline.recipes import RecipeBook
from tiny_llm.pipeline.stage import Resources


def cache_manifest(cache_dir: str) -> str:
    """The token cache's manifest.json, written last when the cache is published: what rules depend on.

    The cache lies where ``data.cache_dir`` says, outside results/ (so not a pattern of the layout).
    """
    return f"{cache_dir.rstrip('/')}/manifest.json"


class DataPlan:
    enabled = True

    def __init__(self, book: RecipeBook, files: PlanFiles) -> None:
        self.book = book
        self.files = files
        self.config = book.config["data"]
        self.cache_dir: str = self.config["cache_dir"]
        self.cache_manifest = cache_manifest(self.cache_dir)
        """The cache as rules name it: never a directory() output, which Snakemake deletes before a rerun."""

    def plan_cache(self, needs: list[int]) -> None:
        """The cache's recipe: the first size's settings, train tokens for the largest need of any job. Only
        the sections the cache depends on (model, data): a change of training or runtime settings (the
        checkpoint interval) rewrites no cache recipe, so it reruns no cache job and no job that reads it."""
        if self.book.sizes:
            first = next(iter(self.book.sizes))
            recipe = recipe_to_dict(self.book.recipe(first, {"data": {"prepare_train_tokens": max(needs)}}))
            self.files.add(PREPARE_RECIPE, {key: recipe[key] for key in ("model", "data")}, stage="data")

    def cache_tokens_needed(self) -> list[int]:
        return [make_budget(self.book.size_recipe(size)).cache_tokens_needed for size in self.book.sizes]

    def prepare_inputs(self) -> dict[str, str]:
        """Rule outputs the cache depends on (nothing for hub corpora and hub tokenizers)."""
        inputs = {}
        if self.config["corpus"] == "embedded":
            inputs["corpus"] = CORPUS_DIR
        if self.config["tokenizer"] == "train":
            inputs["tokenizer"] = TOKENIZER_DIR
        return inputs

    def prepare_recipe(self) -> str:
        if PREPARE_RECIPE not in self.files:
            raise ConfigError("sizes: empty; the token cache is prepared for the sizes' recipes, define one")
        return PREPARE_RECIPE

    def tokenizer_vocab_size(self) -> int:
        """The vocabulary of a tokenizer the workflow trains (0: the tokenizer is not trained here)."""
        if self.config["tokenizer"] != "train":
            return 0
        if not self.book.sizes:
            raise ConfigError("data.tokenizer: 'train' needs an entry in sizes (for model.vocab_size)")
        return self.book.size_recipe(next(iter(self.book.sizes))).model.vocab_size

    def resources(self, wildcards: Any) -> Resources:
        """The demo prepares in seconds, the full C4 prefix takes hours when streamed. data.prepare_workers
        tokenizing processes need a core each beside the reader and writer."""
        workers = (
            self.book.size_recipe(next(iter(self.book.sizes))).data.prepare_workers if self.book.sizes else 1
        )
        return Resources(max(2, workers + 1), 8000, 30 if self.book.is_local_corpus() else 480, 0)

    def targets(self) -> list[str]:
        return [self.cache_manifest]
