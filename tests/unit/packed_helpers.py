"""What the packed engine's tests share: the tiny packed recipe, token batches and a resume halfway."""

from __future__ import annotations

import io
from collections.abc import Callable

import torch

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.packed.engine import PackedEngine

CPU = torch.device("cpu")


def packed_recipe(*sets: str) -> RecipeConfig:
    """Two tiny models packed, 512-token updates."""
    return load_recipe(["packed4-tiny"], ["decentralized.num_models=2", "training.batch_tokens=512", *sets])


def batches(recipe: RecipeConfig, count: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = recipe.training.batch_tokens // recipe.model.context_length
    shape = (n, recipe.model.context_length + 1)
    return [torch.randint(0, recipe.model.vocab_size, shape, generator=gen) for _ in range(count)]


def straight_and_resumed(
    recipe: RecipeConfig, data: list[torch.Tensor], lr: Callable[[int], float]
) -> tuple[PackedEngine, PackedEngine]:
    """One engine trained through ``data``, and one trained through its first half, saved, loaded into a
    fresh engine (through torch.save bytes, as a state file) and trained on through the rest."""
    straight, first = PackedEngine(recipe, CPU), PackedEngine(recipe, CPU)
    half = len(data) // 2
    for step, blocks in enumerate(data, start=1):
        straight.train_step(blocks, lr(step), step)
    for step, blocks in enumerate(data[:half], start=1):
        first.train_step(blocks, lr(step), step)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = PackedEngine(recipe, CPU)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for step, blocks in enumerate(data[half:], start=half + 1):
        resumed.train_step(blocks, lr(step), step)
    return straight, resumed
