"""Resumable training state files (``latest.pt``, ``final.pt``, ``epoch-NNN.pt``): atomic, self-describing."""

from __future__ import annotations

import os
import random
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from tiny_llm.errors import RunStateError
from tiny_llm.io import atomic_write_with

STATE_FORMAT = "tiny-llm-train-state"
STATE_VERSION = 1
LATEST, FINAL = "latest.pt", "final.pt"
SET_ASIDE_SUFFIX = ".corrupt"
"""A damaged state file is renamed ``<name>.corrupt`` (then ``.corrupt-2``, ...; kept, never deleted)."""


class DamagedStateError(RunStateError):
    """A state file that cannot be used: truncated, altered (a zip checksum fails), or not a state file."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = Path(path), " ".join(reason.split())[:200]
        super().__init__(
            f"{path}: damaged training state ({self.reason}); pass another state or --resume auto"
        )


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to a temp sibling, fsync, rename: a reader never sees half a state."""
    atomic_write_with(path, lambda handle: torch.save(obj, handle))


def rng_state() -> dict[str, Any]:
    # The legacy tuple: ("MT19937", keys, pos, has_gauss, cached_gaussian).
    np_state = cast("tuple[Any, ...]", np.random.get_state())
    state: dict[str, Any] = {
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


def unreadable(path: Path, exc: BaseException) -> RunStateError:
    """A state that could not be read for a reason other than damage (access, I/O, memory, a loader's
    refusal): one line, and the file stays where it is."""
    if isinstance(exc, MemoryError):
        what = "out of memory"
    elif isinstance(exc, OSError) and exc.strerror:
        what = exc.strerror
    else:
        what = f"{type(exc).__name__}: {' '.join(str(exc).split('. ')[0].split())[:160]}"
    return RunStateError(
        f"cannot read training state {path} ({what}); nothing was changed: fix the cause and rerun"
    )


def verify_state_file(path: Path) -> None:
    """Check every record of the state's zip container against its CRC-32 (torch.save writes them;
    torch.load reads neither them nor a truncated file's missing bytes until it is too late). Only a failed
    check is damage (DamagedStateError); an access, I/O or memory error is RunStateError."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except FileNotFoundError:
        raise RunStateError(f"resume state not found: {path}") from None
    except (zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise DamagedStateError(path, f"truncated or not a state file: {exc}") from None
    except (OSError, MemoryError) as exc:
        if isinstance(exc, OSError) and exc.errno is None:  # zipfile's own seek past a truncated end
            raise DamagedStateError(path, f"truncated or not a state file: {exc}") from None
        raise unreadable(path, exc) from None
    if bad is not None:
        raise DamagedStateError(path, f"checksum mismatch in record {bad}")


def load_state(path: Path, *, lazy: bool = False, verify: bool = True) -> dict[str, Any]:
    """Load a state file onto the CPU, its checksums verified first (``verify``: a follower rank skips them,
    rank 0 verified the file); ``lazy`` memory-maps tensors and skips the checksums (cheap header reads).
    DamagedStateError names a damaged file."""
    if verify and not lazy:
        verify_state_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=lazy)
    except FileNotFoundError:
        raise RunStateError(f"resume state not found: {path}") from None
    except Exception as exc:  # damaged (if its checksums fail: memory-mapping a file truncated to 4-64 KiB
        # fails with EINVAL), an access, I/O or memory error, or the loader's refusal
        if lazy:
            verify_state_file(path)  # DamagedStateError when it is damaged
        raise unreadable(path, exc) from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise RunStateError(f"{path} is not a tiny-llm training state; move it away or pass another")
    if state.get("version") != STATE_VERSION:
        raise RunStateError(
            f"{path}: state version {state.get('version')} is not supported; resume it with the tiny-llm "
            "version that wrote it, or move it away to start the run afresh"
        )
    return state


def state_candidates(run_dir: Path) -> list[Path]:
    names = [LATEST, FINAL, *sorted(p.name for p in run_dir.glob("epoch-*.pt"))]
    return [run_dir / n for n in names if (run_dir / n).is_file()]


def _header_step(path: Path) -> int:
    try:
        return int(load_state(path, lazy=True)["progress"]["step"])
    except (KeyError, TypeError, ValueError) as exc:
        verify_state_file(path)  # DamagedStateError when it is damaged; else it is not ours to set aside
        raise RunStateError(f"{path} holds no progress step ({type(exc).__name__}: {exc})") from None


def newest_state(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The valid state with the most updates (final.pt wins ties) and warnings about unreadable ones
    (header reads only: a file damaged after its header is found by load_state's checksums)."""
    best: tuple[int, int, Path] | None = None
    warnings = []
    for path in state_candidates(run_dir):
        try:
            step = _header_step(path)
        except RunStateError as exc:
            warnings.append(f"skipping {path.name}: {exc}")
            continue
        rank = (step, 1 if path.name == FINAL else 0, path)
        if best is None or rank[:2] > best[:2]:
            best = rank
    return (best[2] if best else None), warnings


def set_aside(path: Path) -> Path:
    """Rename a damaged state to ``<name>.corrupt`` (``.corrupt-2``, ... when taken: an earlier one is never
    overwritten) so no resume picks it again."""
    number = 1
    while True:
        aside = path.with_name(path.name + SET_ASIDE_SUFFIX + (f"-{number}" if number > 1 else ""))
        try:
            os.link(path, aside)  # fails if ``aside`` exists, unlike a rename
        except FileExistsError:
            number += 1
            continue
        os.unlink(path)
        return aside


def newest_usable_state(
    run_dir: Path, log: Callable[[str], None]
) -> tuple[Path | None, dict[str, Any] | None]:
    """The newest state that loads and passes its checksums (final.pt wins ties), loaded, or (None, None).

    Every damaged state met on the way is set aside as ``<name>.corrupt`` and named in one ``log`` line
    saying what is used instead: an older state, or a fresh start when none is left.
    """
    ranked, damaged = [], []
    for path in state_candidates(run_dir):
        try:
            ranked.append(((_header_step(path), 1 if path.name == FINAL else 0), path))
        except DamagedStateError as exc:
            damaged.append(exc)
    chosen: tuple[Path, dict[str, Any]] | None = None
    for _, path in sorted(ranked, key=lambda item: item[0], reverse=True):
        try:
            chosen = (path, load_state(path))
            break
        except DamagedStateError as exc:
            damaged.append(exc)
    if chosen is None:
        instead = "no other valid state: starting the run afresh"
    else:
        instead = f"resuming from {chosen[0].name} (step {int(chosen[1]['progress']['step'])}) instead"
    for error in damaged:
        aside = set_aside(error.path)
        log(f"warning: {error.path} is damaged ({error.reason}); kept as {aside.name}; {instead}")
    return chosen if chosen is not None else (None, None)


def epoch_stem(epoch: int) -> str:
    return f"epoch-{epoch:03d}"
