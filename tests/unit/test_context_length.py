"""model.context_length as a recipe knob: model, RoPE tables, loader and evaluation blocks, budget and
identity follow it; one cache serves every context its tokens can be cut to; what does not fit is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tiny_llm.budget import make_budget
from tiny_llm.config import load_recipe, recipe_identity
from tiny_llm.data.cache import open_cache
from tiny_llm.data.loader import TrainLoader, validation_subset
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.model import Llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("context", [32, 64, 128])
def test_one_cache_serves_every_context(
    context: int, tiny_cache: Path, tiny_recipe_args: Callable[[Path], list[str]]
) -> None:
    sets = [
        *tiny_recipe_args(tiny_cache),
        f"model.context_length={context}",
        f"training.batch_tokens={context * 8}",
    ]
    recipe = load_recipe(["tiny"], sets)
    budget = make_budget(recipe)
    assert budget.num_blocks == -(-budget.target_tokens // context)  # full blocks of this context
    model = Llama(recipe.model)
    assert model.rope_cos.shape[0] == context
    assert model(torch.zeros(1, context, dtype=torch.long)).shape == (1, context, recipe.model.vocab_size)
    with open_cache(tiny_cache) as cache:
        with TrainLoader(cache, context, budget.num_blocks, seed=1, prefetch=False) as loader:
            assert loader.next_blocks(3).shape == (3, context + 1)  # inputs and targets overlap by one
        subset = validation_subset(cache, context, 4, seed=0)
        assert subset.shape == (4, context + 1)
    other = load_recipe(["tiny"], [*sets[:-2], "model.context_length=16", "training.batch_tokens=128"])
    assert recipe_identity(recipe, "cache") != recipe_identity(other, "cache")


def test_contexts_that_do_not_hold_are_refused_in_one_line(tiny_cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"training.batch_tokens.*context") as error:
        load_recipe(["tiny"], ["model.context_length=48"])  # 1,024 is no multiple of 48
    assert "\n" not in str(error.value).strip()
    with open_cache(tiny_cache) as cache:
        too_long = cache.num_tokens("validation")
        with pytest.raises(DataError, match="shorter than one block"):
            validation_subset(cache, too_long, 4, seed=0)
        with pytest.raises(DataError, match="too small"):
            TrainLoader(cache, cache.num_tokens("train"), 1, seed=1, prefetch=False)
    with pytest.raises(ValueError, match="exceeds model.context_length"):
        Llama(load_recipe(["tiny"]).model)(torch.zeros(1, 65, dtype=torch.long))
