"""Build the engine a recipe needs, and run its training and the evaluation of its checkpoints.

The ordinary engine (``train/``) and the packed one (``packed/``) stand side by side on
the runtime's engine contract, and the training loop and checkpoint evaluation drive
any ``Engine``. This module sits above both engines and is the one place that knows
which engine a recipe gets; the CLI, the benchmark worker and the tests use it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tiny_llm.config import RecipeConfig
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.runtime.engine import Engine
from tiny_llm.train import distributed, evaluate, session
from tiny_llm.train.engine import ModelEngine
from tiny_llm.train.graph import GraphEngine


def build_engine(recipe: RecipeConfig, device: torch.device) -> Engine:
    """The ordinary engine, the packed one for ``decentralized`` recipes, or on CUDA the captured one for
    runtime.cuda_graph. Elsewhere such a recipe gets the ordinary engine, which reads and writes the same
    states: evaluating or exporting a run needs no graph (training refuses it: ``check_cuda_graph``)."""
    if recipe.decentralized is not None:
        return PackedEngine(recipe, device)
    if recipe.runtime.cuda_graph and device.type == "cuda":
        return GraphEngine(recipe, device)
    if distributed.active():  # one of runtime.num_gpus ranks (the config refuses packed and graph runs)
        return distributed.DistributedEngine(recipe, device)
    return ModelEngine(recipe, device)


def run_training(
    recipe: RecipeConfig,
    resume: str | None = None,
    quiet: bool = False,
    plan: session.Continuation | None = None,
    *,
    set_aside_changed: bool = False,
    keep: tuple[Path, ...] = (),
) -> int:
    """Train ``recipe`` into runtime.output_dir (exit codes, set_aside_changed: ``tiny_llm.train.loop``;
    ``plan``: a trunk's stop and kept states, or a branch's starting state). Under `tiny_llm launch` or
    torchrun (or with runtime.num_gpus > 1) this process trains as one rank of
    ``tiny_llm.train.distributed``."""

    def train(rank_recipe: RecipeConfig, follower: bool) -> int:
        return session.run_training(
            rank_recipe,
            build_engine,
            resume=resume,
            quiet=quiet or follower,
            plan=plan,
            set_aside_changed=set_aside_changed,
            keep=keep,
        )

    ranks = distributed.launched_ranks()
    if recipe.runtime.num_gpus == 1 and (ranks is None or ranks.world_size == 1):
        return train(recipe, False)
    return distributed.run_ranks(recipe, train)


def evaluate_checkpoint(recipe: RecipeConfig, path: Path, *, full: bool) -> dict[str, object]:
    """Validation loss of a .safetensors weights file or a .pt training state (packed: averaged model)."""
    return evaluate.evaluate_checkpoint(recipe, path, build_engine, full=full)
