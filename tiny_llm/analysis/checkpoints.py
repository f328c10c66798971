"""A run's saved state as the analysis needs it: the (averaged) weights, each worker's weights for packed
runs, where in training it was saved, and a hash of the weights that identifies it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from tiny_llm.analysis.names import FINAL, checkpoint_epoch
from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig, recipe_identity
from tiny_llm.errors import RunStateError
from tiny_llm.train import checkpoint


@dataclass
class SavedWeights:
    name: str
    """The name asked for without its suffix (epoch-003, final, latest)."""
    path: Path
    step: int
    """Updates done when it was saved."""
    epoch: int
    """Epochs completed."""
    tokens: int
    """Training targets consumed (packed: all workers together)."""
    weights: dict[str, torch.Tensor]
    """The model's parameters (packed: the FP32 mean of the workers), on the CPU."""
    workers: list[dict[str, torch.Tensor]] | None = None
    """Packed runs, when asked for: every worker's parameters."""
    blocks_per_range: int | None = None
    """The training loader's range size, where a state file records it."""
    hashes: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.path.name,
            "step": self.step,
            "epoch": self.epoch,
            "tokens": self.tokens,
            **self.hashes,
        }


def weights_hash(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and bytes of ``state``, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)};".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def checkpoint_files(run_dir: Path) -> list[str]:
    """Names of the states and weights in ``run_dir`` (what --checkpoint accepts), sorted."""
    stems = {p.stem for p in run_dir.glob("*.pt")} | {p.stem for p in run_dir.glob("*.safetensors")}
    return sorted(stems)


def resolve_checkpoint(run_dir: Path, name: str) -> Path:
    """``epoch-NNN`` / ``final`` / ``latest`` (or a file name) -> the state file, else its .safetensors."""
    stem = name.removesuffix(".pt").removesuffix(".safetensors")
    candidates = [run_dir / f"{stem}.pt", run_dir / f"{stem}.safetensors"]
    if name != stem:
        candidates = [run_dir / name]
    for path in candidates:
        if path.is_file():
            return path
    have = ", ".join(checkpoint_files(run_dir)) or "none"
    raise RunStateError(
        f"run {run_dir} has no checkpoint {name!r} (looked for {', '.join(p.name for p in candidates)}); "
        f"it has: {have}"
    )


def _position(recipe: RecipeConfig, stem: str) -> tuple[int, int, int]:
    """(step, epoch, tokens) of weights-only files, from the budget: epoch-NNN or final."""
    budget = make_budget(recipe)
    epoch = budget.num_epochs if stem == FINAL else checkpoint_epoch(stem)
    if epoch is None or not 1 <= epoch <= budget.num_epochs:
        raise RunStateError(
            f"{stem}.safetensors: cannot tell where in training it was saved; analyse a .pt state instead"
        )
    step = sum(len(budget.epoch_updates(e)) for e in range(epoch))
    return step, epoch, budget.epoch_boundaries[epoch - 1] * budget.context_length


def _packed_weights(engine: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """Averaged and per-worker weights from a packed state's arena ([N, width]) and layout."""
    arena = engine["arena"]
    mean = arena.float().mean(dim=0)  # as PackedLlama.copy_average_to
    average: dict[str, torch.Tensor] = {}
    workers: list[dict[str, torch.Tensor]] = [{} for _ in range(arena.shape[0])]
    for entry in engine["layout"]:
        start, numel, shape = entry["start"], entry["numel"], tuple(entry["shape"])
        average[entry["name"]] = mean[start : start + numel].view(shape).clone()
        for index, worker in enumerate(workers):
            worker[entry["name"]] = arena[index, start : start + numel].view(shape).clone()
    return average, workers


def load_saved_weights(
    run_dir: Path, name: str, recipe: RecipeConfig, cache_identity: str, *, workers: bool
) -> SavedWeights:
    """The checkpoint ``name`` of the run of ``recipe`` in ``run_dir``; ``workers``: also every worker's
    weights (packed runs). A state written by another recipe (or cache) than resolved.yaml's is refused."""
    path = resolve_checkpoint(run_dir, name)
    stem = path.name.removesuffix(".pt").removesuffix(".safetensors")
    packed = recipe.decentralized is not None
    if path.suffix == ".pt":
        state = checkpoint.load_state(path)
        if state.get("recipe_identity") != recipe_identity(recipe, cache_identity):
            raise RunStateError(
                f"{path} was written by another recipe or token cache than {run_dir / 'resolved.yaml'}; "
                "analyse it with the resolved.yaml of the run that wrote it"
            )
        progress, engine = state["progress"], state["engine"]
        if packed:
            weights, worker_weights = _packed_weights(engine)
        else:
            weights, worker_weights = engine["model"], None
        found = SavedWeights(
            stem,
            path,
            int(progress["step"]),
            int(progress["epochs_done"]),
            int(progress["tokens"]),
            weights,
            worker_weights if workers else None,
            blocks_per_range=state.get("loader", {}).get("blocks_per_range"),
        )
    else:
        step, epoch, tokens = _position(recipe, stem)
        worker_weights = None
        if packed and workers and recipe.decentralized is not None:
            num_models = recipe.decentralized.num_models
            files = [path.parent / f"node-{i:03d}" / path.name for i in range(num_models)]
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise RunStateError(
                    f"packed checkpoint {path} lacks the worker weights {missing[0]}; pass --no-consensus"
                )
            worker_weights = [load_file(str(f)) for f in files]
        found = SavedWeights(stem, path, step, epoch, tokens, load_file(str(path)), worker_weights)
        found.blocks_per_range = _run_range_size(run_dir)
    found.hashes["weights_hash"] = weights_hash(found.weights)
    if found.workers is not None:
        found.hashes["worker_hashes"] = [weights_hash(w) for w in found.workers]
    return found


def _run_range_size(run_dir: Path) -> int | None:
    """The loader range size recorded by any state file of the run (they all keep the first session's)."""
    path, _ = checkpoint.newest_state(run_dir)
    if path is None:
        return None
    return checkpoint.load_state(path, lazy=True).get("loader", {}).get("blocks_per_range")
