"""The two data cases of an analysis: the blocks of one epoch, in training order, and its effective batches.

``seen``: the run's first epoch exactly as training visited it: the training loader over the budget's blocks,
seeded with its data seed (training.data_seed, else runtime.seed), range size and data passes as the run used
them, each update's blocks in turn.
``unseen``: one epoch of blocks training never used (those after the last block it reads), as many whole
effective batches as fit in the first epoch's blocks, visited by the same loader over that range.

An effective batch is what one gradient of training was computed on: an update's blocks, or for packed runs
one worker's share of an update (rows w, w+N, w+2N, ... of the global batch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from tiny_llm.analysis.names import cache_tokens_needed, unseen_range
from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig
from tiny_llm.data.cache import TokenCache
from tiny_llm.data.loader import TrainLoader
from tiny_llm.data.sources import Split
from tiny_llm.errors import DataError


@dataclass(frozen=True)
class EffectiveBatch:
    index: int
    """Position among the epoch's effective batches."""
    update: int
    """0-based update of the epoch it belongs to."""
    worker: int | None
    """Packed runs: the worker whose share it is."""
    start: int
    stop: int
    step: int
    """Rows start:stop:step of the epoch's blocks."""

    @property
    def num_blocks(self) -> int:
        return len(range(self.start, self.stop, self.step))


@dataclass
class AnalysisEpoch:
    case: str
    blocks: torch.Tensor
    """int64 [n, L+1] in training order (CPU)."""
    first_block: int
    """Index in the cache's train split where the case's range of blocks starts."""
    range_blocks: int
    """Blocks in that range (the epoch's blocks are a permutation of them)."""
    batches: list[EffectiveBatch]
    blocks_per_range: int
    """The loader's range size (decides the order)."""

    @property
    def num_blocks(self) -> int:
        return self.blocks.shape[0]

    @property
    def num_targets(self) -> int:
        return self.blocks.shape[0] * (self.blocks.shape[1] - 1)

    def batch_blocks(self, batch: EffectiveBatch) -> torch.Tensor:
        return self.blocks[batch.start : batch.stop : batch.step]

    def metadata(self) -> dict[str, Any]:
        sizes = sorted({b.num_blocks for b in self.batches})
        return {
            "case": self.case,
            "first_block": self.first_block,
            "range_blocks": self.range_blocks,
            "num_blocks": self.num_blocks,
            "num_targets": self.num_targets,
            "num_batches": len(self.batches),
            "batch_blocks": sizes,
            "blocks_per_range": self.blocks_per_range,
        }


class _ShiftedCache:
    """The train split from ``offset`` tokens on, for a TrainLoader (which reads from token 0)."""

    def __init__(self, cache: TokenCache, offset: int) -> None:
        self.cache, self.offset = cache, offset
        self.path = cache.path

    def check_capacity(self, tokens: int) -> None:
        self.cache.check_capacity(self.offset + tokens)

    def read(self, split: Split, start: int, stop: int) -> np.ndarray:
        return self.cache.read(split, self.offset + start, self.offset + stop)


def load_epoch(
    recipe: RecipeConfig, cache: TokenCache, case: str, blocks_per_range: int | None = None
) -> AnalysisEpoch:
    """The blocks and effective batches of ``case`` (see the module doc); DataError if the cache is short.

    ``blocks_per_range``: the loader's range size as the run used it (a training state records it); None
    derives it from data.buffer_size_mib, as a fresh run does.
    """
    budget = make_budget(recipe)
    L = recipe.model.context_length
    workers = recipe.decentralized.num_models if recipe.decentralized else 1
    if case == "seen":
        first_block, range_blocks = 0, budget.num_blocks
        updates = budget.epoch_updates(0)
        source: Any = cache
    elif case == "unseen":
        first_block, range_blocks = unseen_range(recipe)
        full, rest = divmod(range_blocks, budget.blocks_per_update)
        updates = [budget.blocks_per_update] * full + ([rest] if rest else [])
        need = cache_tokens_needed(recipe, ("unseen",))
        have = cache.num_tokens("train")
        if have < need:
            raise DataError(
                f"cache too small for the unseen case: need {need} train tokens (the run's {budget.tokens} "
                f"and one more epoch of {range_blocks * L}), have {have} in {cache.path}; prepare a cache "
                f"with data.prepare_train_tokens >= {need} in a new data.cache_dir"
            )
        source = _ShiftedCache(cache, first_block * L)
    else:
        raise ValueError(f"unknown data case {case!r}")
    loader = TrainLoader(
        source,
        L,
        range_blocks,
        recipe.data_seed,
        buffer_size_mib=recipe.data.buffer_size_mib,
        prefetch=False,
        blocks_per_range=blocks_per_range,
        passes=budget.data_passes if case == "seen" else 1,
        shuffle_group_size=recipe.data.shuffle_group_size if case == "seen" else None,
    )
    try:
        blocks = torch.cat([loader.next_blocks(n) for n in updates])
        bpr = loader.blocks_per_range
    finally:
        loader.close()
    batches: list[EffectiveBatch] = []
    offset = 0
    for update, n in enumerate(updates):
        for worker in range(workers):
            batches.append(
                EffectiveBatch(
                    index=len(batches),
                    update=update,
                    worker=worker if recipe.decentralized else None,
                    start=offset + worker,
                    stop=offset + n,
                    step=workers,
                )
            )
        offset += n
    return AnalysisEpoch(case, blocks, first_block, range_blocks, batches, bpr)


def batch_record(batch: EffectiveBatch) -> dict[str, Any]:
    return {**asdict(batch), "num_blocks": batch.num_blocks}
