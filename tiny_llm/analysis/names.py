"""What an analysis of a run needs, known from its recipe before the run exists (torch-free): the names of the
checkpoints it saves, and the blocks and cache size of the unseen case.

A name is what ``analyze --checkpoint`` takes: ``epoch-NNN`` (the state or weights saved at the end of
epoch NNN, policy ``all``), ``final`` (the final state, every policy but ``none``) or ``latest`` (the
rolling state of policies ``interval``/``all``, which changes while the run trains; never planned).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tiny_llm.budget import kept_epochs, make_budget

if TYPE_CHECKING:
    from tiny_llm.config import RecipeConfig

CASES = ("seen", "unseen")
FINAL, LATEST = "final", "latest"
_EPOCH = re.compile(r"epoch-(\d{3,})")


def epoch_checkpoint(epoch: int) -> str:
    """``epoch-NNN``: the stem of the files the trainer writes at the end of 1-based ``epoch``
    (``tiny_llm.train.checkpoint.epoch_stem``; a test keeps the two equal)."""
    return f"epoch-{epoch:03d}"


def checkpoint_epoch(name: str) -> int | None:
    """1-based epoch of an ``epoch-NNN`` name, None for other names."""
    match = _EPOCH.fullmatch(name)
    return int(match[1]) if match else None


def saved_checkpoints(recipe: RecipeConfig) -> list[str]:
    """The stable checkpoints a completed run of ``recipe`` holds, in training order.

    ``all``: every epoch's state (``epoch-001`` .. ``epoch-E``; the final state has the last epoch's weights,
    so ``final`` is not listed again); ``interval`` and ``final``: ``final``; ``none``: nothing. With
    training.checkpoint_epochs, those epochs' states, then ``final`` unless the last epoch is among them.
    """
    policy = recipe.training.checkpoint_policy
    if recipe.training.checkpoint_epochs is not None and policy in ("interval", "all"):
        epochs = kept_epochs(recipe)
        last = make_budget(recipe).num_epochs
        return [epoch_checkpoint(e) for e in epochs] + ([] if last in epochs else [FINAL])
    if policy == "all":
        return [epoch_checkpoint(e) for e in range(1, make_budget(recipe).num_epochs + 1)]
    if policy in ("interval", "final"):
        return [FINAL]
    return []


def missing_checkpoints(recipe: RecipeConfig, wanted: list[str]) -> list[str]:
    """The names in ``wanted`` a completed run of ``recipe`` will not have (for a one-line plan error)."""
    saved = set(saved_checkpoints(recipe))
    if recipe.training.checkpoint_policy in ("interval", "all"):
        saved.add(FINAL)
    return [name for name in wanted if name not in saved]


def unseen_range(recipe: RecipeConfig) -> tuple[int, int]:
    """(first block, blocks) of the unseen case: right after the last block training reads (the budget's last,
    with training.data_passes the last unique one, with loader v2 the last of its groups), the first epoch's
    blocks rounded down to whole effective batches (a first epoch shorter than one batch: whole workers)."""
    budget = make_budget(recipe)
    workers = recipe.decentralized.num_models if recipe.decentralized else 1
    first, per_update = budget.epoch_boundaries[0], budget.blocks_per_update
    if first >= per_update:
        return budget.read_blocks, first // per_update * per_update
    return budget.read_blocks, max(workers, first // workers * workers)


def cache_tokens_needed(recipe: RecipeConfig, cases: tuple[str, ...] = CASES) -> int:
    """Train tokens a cache must hold to analyse a run of ``recipe`` on ``cases`` (unseen: one epoch more)."""
    if "unseen" not in cases:
        return make_budget(recipe).cache_tokens_needed
    first, blocks = unseen_range(recipe)
    return (first + blocks) * recipe.model.context_length + 1
