"""Recipes of the workflow's jobs: a size's preset <- recipe_defaults <- the size's and the job's overrides
<- the workflow's data settings, validated by the library's typed config (one merge for every stage)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiny_llm.config import RecipeConfig, deep_merge, read_config_source, recipe_from_dict
from tiny_llm.data.sources import is_local_dataset
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.layout import CORPUS_DIR, TOKENIZER_DIR
from tiny_llm.pipeline.stage import Resources

# Recipe fields every size must share, because one token cache serves them all.
CACHE_FIELDS = (
    "dataset",
    "dataset_revision",
    "tokenizer",
    "tokenizer_revision",
    "shuffle_seed",
    "shuffle_buffer",
)


class RecipeBook:
    """The sizes of a validated workflow config and every recipe built from them."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.sizes: Mapping[str, Mapping[str, Any]] = config["sizes"]
        self._presets: dict[str, dict[str, Any]] = {}
        self._size_recipes: dict[str, RecipeConfig] = {}

    # ------------------------------------------------------------------ data locations

    def is_local_corpus(self) -> bool:
        corpus = self.config["data"]["corpus"]
        return corpus == "embedded" or Path(corpus).is_dir()

    def corpus_dataset(self) -> str:
        """data.dataset of every recipe: the built demo corpus, a local directory or a hub id."""
        corpus = self.config["data"]["corpus"]
        return CORPUS_DIR if corpus == "embedded" else corpus

    def tokenizer_location(self) -> str:
        tokenizer = self.config["data"]["tokenizer"]
        return TOKENIZER_DIR if tokenizer == "train" else tokenizer

    def data_overrides(self) -> dict[str, Any]:
        """The data.* keys the workflow decides for every recipe (one corpus, tokenizer and cache)."""
        data = self.config["data"]
        return {
            "data": {
                "dataset": self.corpus_dataset(),
                "dataset_revision": data["corpus_revision"],
                "tokenizer": self.tokenizer_location(),
                "tokenizer_revision": data["tokenizer_revision"],
                "cache_dir": data["cache_dir"],
                "prepare_validation_tokens": data["prepare_validation_tokens"],
            }
        }

    # ------------------------------------------------------------------ recipes

    def check_size(self, size: str, where: str) -> None:
        if size not in self.sizes:
            raise ConfigError(f"{where}: unknown size '{size}'; sizes: {', '.join(self.sizes) or 'none'}")

    def preset(self, source: str) -> dict[str, Any]:
        """A preset name or recipe YAML path as a mapping (read once; a fresh copy each call)."""
        if source not in self._presets:
            self._presets[source] = read_config_source(source)
        return copy.deepcopy(self._presets[source])

    def overrides(self, size: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """recipe_defaults <- the size's overrides <- ``overrides`` <- the workflow's data settings."""
        merged = deep_merge(self.config["recipe_defaults"], self.sizes[size]["overrides"])
        if self.num_gpus(size) != 1:  # an execution setting: the recipe identity stays that of one GPU
            merged = deep_merge(merged, {"runtime": {"num_gpus": self.num_gpus(size)}})
        return deep_merge(deep_merge(merged, dict(overrides or {})), self.data_overrides())

    def num_gpus(self, size: str) -> int:
        """Ranks of one model in a training job of ``size``."""
        return int(self.sizes[size].get("num_gpus", 1))

    def check_one_gpu(self, size: str, where: str, what: str) -> None:
        """``what`` (packed runs, the tuner) runs one process per job: refuse a size of several ranks."""
        if self.num_gpus(size) != 1:
            raise ConfigError(
                f"{where}: size '{size}' has num_gpus {self.num_gpus(size)}, and {what} run on one GPU; "
                "use a size with num_gpus 1"
            )

    def mapping(
        self, size: str, overrides: Mapping[str, Any] | None = None, presets: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """The unvalidated recipe mapping: the size's preset, then ``presets``, then the overrides."""
        merged = self.preset(self.sizes[size]["preset"])
        for source in presets:
            merged = deep_merge(merged, self.preset(source))
        return deep_merge(merged, self.overrides(size, overrides))

    def recipe(
        self,
        size: str,
        overrides: Mapping[str, Any] | None = None,
        presets: tuple[str, ...] = (),
        where: str | None = None,
    ) -> RecipeConfig:
        """The validated recipe; a problem is a ConfigError that names ``where`` (default: the size)."""
        where = where or f"sizes.{size}"
        self.check_size(size, f"{where}.size")
        try:
            return recipe_from_dict(self.mapping(size, overrides, presets))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def size_recipe(self, size: str) -> RecipeConfig:
        if size not in self._size_recipes:
            self._size_recipes[size] = self.recipe(size)
        return self._size_recipes[size]

    def check_one_cache(self) -> None:
        """All sizes share one tokenizer and token cache: same vocabulary and data fields."""
        names = list(self.sizes)
        recipes = {name: self.size_recipe(name) for name in names}
        if not names:
            return
        first = recipes[names[0]]
        for name in names[1:]:
            other = recipes[name]
            if other.model.vocab_size != first.model.vocab_size:
                raise ConfigError(
                    f"sizes.{name}: model.vocab_size {other.model.vocab_size} differs from size '{names[0]}' "
                    f"({first.model.vocab_size}); all sizes share one tokenizer and token cache"
                )
            for field in CACHE_FIELDS:
                if getattr(other.data, field) != getattr(first.data, field):
                    raise ConfigError(
                        f"sizes.{name}: data.{field} differs from size '{names[0]}'; "
                        "all sizes share one token cache"
                    )
        corpus = self.config["data"]["corpus"]
        if corpus != "embedded" and is_local_dataset(corpus) and not Path(corpus).is_dir():
            raise ConfigError(
                f"data.corpus: directory {corpus} not found (a local corpus is a directory in C4's layout; a "
                "hub corpus is named owner/name); fix the path"
            )
        if self.config["data"]["tokenizer"] == "train" and not self.is_local_corpus():
            raise ConfigError(
                "data.tokenizer: 'train' needs the embedded corpus or a local corpus directory; "
                "for a hub corpus name a hub or local tokenizer"
            )

    def uses_gpu(self, size: str) -> bool:
        return self.size_recipe(size).runtime.device != "cpu"

    def size_resources(self, size: str) -> Resources:
        """A training job of ``size``: its threads, memory and time; a GPU per rank unless it trains on a
        CPU (num_gpus ranks take threads each)."""
        spec, ranks = self.sizes[size], self.num_gpus(size)
        gpus = ranks * int(self.uses_gpu(size))
        return Resources(spec["threads"] * ranks, spec["mem_mb"], spec["runtime_minutes"], gpus, ranks=ranks)
