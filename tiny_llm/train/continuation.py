"""Runs that share a prefix: a trunk that stops early keeping states on the way, and branches started from
one of those states under another total (the WSD horizons from one trunk).

A state of a run with recipe A continues under recipe B when the two differ only in
training.tokens_per_parameter and every update so far had the same blocks and the same learning rate
under both; loader v2 (data.shuffle_group_size) makes the sample order of the shorter a prefix of the
longer's. The branch then computes, bit for bit, what an independent run of B computes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tiny_llm.budget import make_budget, step_lrs
from tiny_llm.config import RecipeConfig, identity_differences, recipe_identity_payload
from tiny_llm.errors import RunStateError
from tiny_llm.io import atomic_write_json, atomic_write_text

STOPPED = "stopped.json"
"""Written last by a run stopped at its --stop-at-step: the step and the states it kept."""
HORIZON_KEY = "training.tokens_per_parameter"


def state_name(step: int) -> str:
    """The immutable state a run keeps after update ``step`` (--keep-state-at)."""
    return f"step-{step:07d}.pt"


def check_continues(state: dict[str, Any], path: Path, recipe: RecipeConfig, cache_identity: str) -> None:
    """RunStateError (one line) unless ``state`` may start a branch of ``recipe``."""
    where = f"cannot start from {path}"
    if recipe.data.shuffle_group_size is None:
        raise RunStateError(f"{where}: a branch needs loader v2 (set data.shuffle_group_size)")
    if state.get("cache_identity") != cache_identity:
        raise RunStateError(f"{where}: it was trained on another token cache")
    payload = recipe_identity_payload(recipe)
    diffs = identity_differences(state["identity_payload"], payload)
    other = [d for d in diffs if not d.startswith(f"{HORIZON_KEY}:")]
    if other:
        raise RunStateError(f"{where}: only {HORIZON_KEY} may differ, not {'; '.join(other)}")
    if recipe.decentralized is not None and recipe.decentralized.adaptive_consensus is not None:
        raise RunStateError(f"{where}: adaptive consensus starts at a fraction of the total updates")
    trunk_horizon = state["identity_payload"]["training"]["tokens_per_parameter"]
    trunk = dataclasses.replace(
        recipe, training=dataclasses.replace(recipe.training, tokens_per_parameter=trunk_horizon)
    )
    step = int(state["progress"]["step"])
    ours, theirs = make_budget(recipe).update_schedule(), make_budget(trunk).update_schedule()
    if step > len(ours) or ours[:step] != theirs[:step] or step_lrs(recipe)[:step] != step_lrs(trunk)[:step]:
        raise RunStateError(
            f"{where}: its first {step} updates differ from this recipe's (blocks or learning rates); "
            "branch from a state at or before this recipe's decay start"
        )


def copy_trunk_metrics(source: Path, target: Path) -> None:
    """The trunk's metrics start the branch's metrics.jsonl (the resume then cuts them at its step)."""
    if source.is_file() and source.resolve() != target.resolve():
        atomic_write_text(target, source.read_text(encoding="utf-8", errors="replace"))


def write_stopped(run_dir: Path, step: int, tokens: int, kept: list[int]) -> None:
    atomic_write_json(
        run_dir / STOPPED, {"step": step, "tokens": tokens, "states": {str(s): state_name(s) for s in kept}}
    )
