"""Which checkpoints a run saves, by name, known from its recipe before it runs (torch-free).

A name is what ``analyze --checkpoint`` takes: ``epoch-NNN`` (the state or weights saved at the end of
epoch NNN, policy ``all``), ``final`` (the final state, every policy but ``none``) or ``latest`` (the
rolling state of policies ``interval``/``all``, which changes while the run trains; never planned).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tiny_llm.budget import make_budget

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
    so ``final`` is not listed again); ``interval`` and ``final``: ``final``; ``none``: nothing.
    """
    policy = recipe.training.checkpoint_policy
    if policy == "all":
        return [epoch_checkpoint(e) for e in range(1, make_budget(recipe).num_epochs + 1)]
    if policy in ("interval", "final"):
        return [FINAL]
    return []


def missing_checkpoints(recipe: RecipeConfig, wanted: list[str]) -> list[str]:
    """The names in ``wanted`` a completed run of ``recipe`` will not have (for a one-line plan error)."""
    saved = set(saved_checkpoints(recipe))
    if recipe.training.checkpoint_policy == "all":
        saved.add(FINAL)
    return [name for name in wanted if name not in saved]
