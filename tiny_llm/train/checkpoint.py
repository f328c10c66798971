"""Resumable training state files (``latest.pt``, ``final.pt``, ``epoch-NNN.pt``): atomic, self-describing."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny_llm.errors import RunStateError
from tiny_llm.io import atomic_write_with

STATE_FORMAT = "tiny-llm-train-state"
STATE_VERSION = 1
LATEST, FINAL = "latest.pt", "final.pt"


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to a temp sibling, fsync, rename: a reader never sees half a state."""
    atomic_write_with(path, lambda handle: torch.save(obj, handle))


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    keys = state["numpy"]["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["numpy"]["pos"], 0, 0.0))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(value: Any) -> Any:
    """Pickle round trips keep tuples, but be lenient with lists from other writers."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def save_state(path: Path, state: dict[str, Any]) -> None:
    atomic_torch_save({"format": STATE_FORMAT, "version": STATE_VERSION, **state}, path)


def load_state(path: Path, *, lazy: bool = False) -> dict[str, Any]:
    """Load a state file onto the CPU; ``lazy`` memory-maps tensors (cheap header reads)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=lazy)
    except FileNotFoundError:
        raise RunStateError(f"resume state not found: {path}") from None
    except Exception as exc:  # truncated or foreign file
        raise RunStateError(f"{path}: not a readable training state ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise RunStateError(f"{path}: not a tiny-llm training state file")
    if state.get("version") != STATE_VERSION:
        raise RunStateError(f"{path}: state version {state.get('version')} is not supported")
    return state


def state_candidates(run_dir: Path) -> list[Path]:
    names = [LATEST, FINAL, *sorted(p.name for p in run_dir.glob("epoch-*.pt"))]
    return [run_dir / n for n in names if (run_dir / n).is_file()]


def newest_state(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The valid state with the most updates (final.pt wins ties) and warnings about unreadable ones."""
    best: tuple[int, int, Path] | None = None
    warnings = []
    for path in state_candidates(run_dir):
        try:
            step = int(load_state(path, lazy=True)["progress"]["step"])
        except (RunStateError, KeyError, TypeError, ValueError) as exc:
            warnings.append(f"skipping {path.name}: {exc}")
            continue
        rank = (step, 1 if path.name == FINAL else 0, path)
        if best is None or rank[:2] > best[:2]:
            best = rank
    return (best[2] if best else None), warnings


def epoch_stem(epoch: int) -> str:
    return f"epoch-{epoch:03d}"
