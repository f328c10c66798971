"""Training loader and validation data over a token cache.

Block k of the train prefix is tokens [kL, kL+L+1): inputs are its first L tokens, targets its last L,
so adjacent blocks overlap by one token and every token after the first is a target exactly once.
The loader reads a contiguous range of blocks (``buffer_size_mib``) into one buffer, views it as
overlapping windows and visits its rows in a seeded permutation; the order of the ranges is seeded
too, so ``seed`` alone fixes the sample order. The next range is read by a background thread. Resume
needs only the block cursor: the order is recomputed and nothing is replayed. With ``passes`` > 1 the
loader visits the first ceil(num_blocks / passes) blocks that many times, each pass in its own seeded
order (the first pass in the order a single pass would have); the last pass may stop early.

Loader v2 (``shuffle_group_size`` G, the reference's Gen D): the ranges are groups of G physical shards
visited in file order; a block belongs to the group holding its first token, and the rows of group g are
visited in the permutation of ``SeedSequence([seed, 1, g])``. Nothing depends on ``num_blocks`` but where
the sequence stops, so a shorter run's samples are an exact prefix of a longer run's with the same seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from tiny_llm.budget import loader_v2_tokens_needed
from tiny_llm.data.cache import DTYPE, TokenCache
from tiny_llm.errors import DataError, RunStateError

LOADER_STATE_VERSION = 1
IGNORE_INDEX = -100
_ORDER_STREAM, _ROWS_STREAM = 0, 1  # independent numpy streams derived from the one seed


class TrainLoader:
    """Blocks of L+1 tokens from the first ``num_blocks`` blocks of a cache's train split, in seeded order."""

    def __init__(
        self,
        cache: TokenCache,
        context_length: int,
        num_blocks: int,
        seed: int,
        buffer_size_mib: int = 64,
        prefetch: bool = True,
        blocks_per_range: int | None = None,
        passes: int = 1,
        shuffle_group_size: int | None = None,
    ) -> None:
        """``blocks_per_range`` overrides the range size derived from ``buffer_size_mib`` (tests);
        ``passes`` (training.data_passes) repeats the first ceil(num_blocks / passes) blocks;
        ``shuffle_group_size`` (data.shuffle_group_size) selects loader v2."""
        if context_length < 1 or num_blocks < 1 or buffer_size_mib < 1 or not 1 <= passes <= num_blocks:
            raise ValueError("context_length, num_blocks, buffer_size_mib and passes must be positive")
        if shuffle_group_size is not None and (shuffle_group_size < 1 or passes != 1):
            raise ValueError("shuffle_group_size must be positive and needs a single data pass")
        self.passes = passes
        self.unique_blocks = -(-num_blocks // passes)
        self.shuffle_group_size = shuffle_group_size
        if shuffle_group_size is None:
            cache.check_capacity(self.unique_blocks * context_length + 1)
        self.cache = cache
        self.context_length = context_length
        self.num_blocks = num_blocks
        self.seed = seed
        self.prefetch = prefetch
        self.cursor = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loader") if prefetch else None
        derived = max(1, (buffer_size_mib << 20) // (DTYPE.itemsize * context_length))
        self._plan(blocks_per_range or derived)

    def _plan(self, blocks_per_range: int) -> None:
        """Visiting order of the ranges and where each starts in the sample sequence."""
        self.blocks_per_range = blocks_per_range
        if self.shuffle_group_size is not None:
            self._ranges = group_ranges(
                self.cache, self.shuffle_group_size, self.context_length, self.num_blocks
            )
            self._order = [(0, r) for r in range(len(self._ranges))]  # groups in file order
        else:
            num_ranges = math.ceil(self.unique_blocks / blocks_per_range)
            self._ranges = [
                (r * blocks_per_range, min(blocks_per_range, self.unique_blocks - r * blocks_per_range))
                for r in range(num_ranges)
            ]
            self._order = [
                (p, int(r))
                for p in range(self.passes)
                for r in np.random.default_rng(_pass_stream(self.seed, _ORDER_STREAM, p)).permutation(
                    num_ranges
                )
            ]
        sizes = [self._ranges[r][1] for _, r in self._order]
        self._starts = np.cumsum([0, *sizes])
        self._current: tuple[int, np.ndarray, np.ndarray] | None = None
        self._pending: tuple[int, Future] | None = None

    def _load(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The range visited at ``position``: its overlapping-window view and its row permutation."""
        pass_index, index = self._order[position]
        (first, size), L = self._ranges[index], self.context_length
        tokens = self.cache.read("train", first * L, (first + size) * L + 1)
        windows = np.lib.stride_tricks.sliding_window_view(tokens, L + 1)[::L]
        stream = _pass_stream(self.seed, _ROWS_STREAM, pass_index, index)
        rows = np.random.default_rng(stream).permutation(size)
        return windows, rows

    def _range(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        if self._current is None or self._current[0] != position:
            if self._pending is not None and self._pending[0] == position:
                windows, rows = self._pending[1].result()
            else:
                windows, rows = self._load(position)
            self._pending = None
            self._current = (position, windows, rows)
            if self._pool is not None and position + 1 < len(self._order):
                self._pending = (position + 1, self._pool.submit(self._load, position + 1))
        return self._current[1], self._current[2]

    @property
    def remaining(self) -> int:
        return self.num_blocks - self.cursor

    def next_blocks(self, n: int) -> torch.Tensor:
        """The next ``n`` blocks as int64 [n, L+1] on the CPU; advances the cursor."""
        if not 0 <= n <= self.remaining:
            raise DataError(
                f"loader asked for {n} blocks but only {self.remaining} of {self.num_blocks} remain"
            )
        pieces = [np.empty((0, self.context_length + 1), dtype=DTYPE)]
        filled = 0
        while filled < n:
            position = int(np.searchsorted(self._starts, self.cursor, side="right") - 1)
            windows, rows = self._range(position)
            offset = self.cursor - int(self._starts[position])
            take = min(n - filled, len(rows) - offset)
            pieces.append(
                windows[rows[offset : offset + take]]
            )  # one fancy-index gather (np.take is 100x slower)
            filled += take
            self.cursor += take
        blocks = pieces[-1] if len(pieces) == 2 else np.concatenate(pieces)
        # numpy widens to int64 far faster than torch converts a uint16 tensor.
        return torch.from_numpy(blocks.astype(np.int64))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same sample sequence."""
        return {
            "version": LOADER_STATE_VERSION,
            "cursor": self.cursor,
            "seed": self.seed,
            "num_blocks": self.num_blocks,
            "context_length": self.context_length,
            "blocks_per_range": self.blocks_per_range,
            "passes": self.passes,
            "shuffle_group_size": self.shuffle_group_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state['cursor']``; the saved range size is kept so the order does not change.
        Loader v2's order does not depend on ``num_blocks``: a state of a run with another total continues
        (a branch started from a shared trunk)."""
        keys = ["seed", "num_blocks", "context_length", "passes", "shuffle_group_size"]
        for key in (k for k in keys if k != "num_blocks" or self.shuffle_group_size is None):
            if state.get(key, {"passes": 1}.get(key)) != getattr(self, key):
                raise RunStateError(
                    f"loader state differs: {key} was {state.get(key)!r}, now {getattr(self, key)!r}; "
                    "resume with the recipe the run started with"
                )
        cursor = int(state["cursor"])
        if not 0 <= cursor <= self.num_blocks:
            raise RunStateError(f"loader state cursor {cursor} is outside [0, {self.num_blocks}]")
        self._drop_pending()
        self._plan(int(state.get("blocks_per_range", self.blocks_per_range)))
        self.cursor = cursor

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._pending[1].cancel()
            self._pending = None

    def close(self) -> None:
        self._drop_pending()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._current = None

    def __enter__(self) -> TrainLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def group_ranges(
    cache: TokenCache, group_size: int, context_length: int, num_blocks: int
) -> list[tuple[int, int]]:
    """(first block, blocks) of each loader-v2 group up to the one holding sample ``num_blocks`` - 1.

    A block belongs to the group holding its first token. Every group used must be complete (a shard
    follows it, so its own shards are full) and its last block must fit; DataError otherwise.
    """
    sizes, L = cache.shard_sizes("train"), context_length
    ranges, start, total = [], 0, 0
    for g in range(0, len(sizes), group_size):
        end = start + sum(sizes[g : g + group_size])
        first, stop = -(-start // L), -(-end // L)
        ranges.append((first, stop - first))
        total += stop - first
        complete = g + group_size < len(sizes) and stop * L + 1 <= cache.num_tokens("train")
        if total >= num_blocks and complete:
            return ranges
        if total >= num_blocks or not complete:
            break
        start = end
    need = loader_v2_tokens_needed(num_blocks, L, group_size * sizes[0])
    raise DataError(
        f"cache too small for data.shuffle_group_size={group_size} (seeded training needs complete groups): "
        f"need {need} train tokens, have {cache.num_tokens('train')} in {cache.path}; prepare a larger cache"
    )


def _entropy(seed: int) -> int:
    """numpy seeds must be non-negative; this keeps non-negative seeds as they are."""
    return seed % 2**64


def _pass_stream(seed: int, stream: int, pass_index: int, *rest: int) -> list[int]:
    """A numpy seed sequence of one stream; pass 0 keeps the single-pass sequence (and so its order)."""
    if pass_index == 0:
        return [_entropy(seed), stream, *rest]
    return [_entropy(seed), stream, *rest, pass_index + 2**32]


def validation_num_full_blocks(cache: TokenCache, context_length: int) -> int:
    return (cache.num_tokens("validation") - 1) // context_length


def validation_num_targets(cache: TokenCache) -> int:
    """Targets of a full validation pass: every validation token after the first."""
    return cache.num_tokens("validation") - 1


def validation_subset(cache: TokenCache, context_length: int, subset_blocks: int, seed: int) -> torch.Tensor:
    """``subset_blocks`` full validation blocks (fewer if the split is smaller), chosen by
    ``numpy.random.default_rng(seed)`` without replacement, sorted, as int64 [n, L+1]."""
    L = context_length
    available = validation_num_full_blocks(cache, L)
    if available < 1:
        raise DataError(
            f"token cache {cache.path}: the validation split is shorter than one block of {L + 1}"
        )
    chosen = np.sort(
        np.random.default_rng(_entropy(seed)).choice(
            available, size=min(subset_blocks, available), replace=False
        )
    )
    rows = np.stack([cache.read("validation", int(k) * L, int(k) * L + L + 1) for k in chosen])
    return torch.from_numpy(rows.astype(np.int64))


def iter_validation(
    cache: TokenCache, context_length: int, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The whole validation split as (inputs, targets) int64 [b, L] batches; the last block is padded
    with input 0 and target -100, so the valid targets number `validation_num_targets(cache)`."""
    L, total = context_length, cache.num_tokens("validation")
    num_blocks = math.ceil((total - 1) / L)
    for first in range(0, num_blocks, batch_size):
        count = min(batch_size, num_blocks - first)
        tokens = cache.read("validation", first * L, min((first + count) * L + 1, total)).astype(np.int64)
        inputs = np.zeros(count * L + 1, dtype=np.int64)
        targets = np.full(count * L + 1, IGNORE_INDEX, dtype=np.int64)
        inputs[: len(tokens)] = tokens
        targets[: len(tokens)] = tokens
        yield (
            torch.from_numpy(inputs[:-1].reshape(count, L)),
            torch.from_numpy(targets[1:].reshape(count, L).copy()),
        )
