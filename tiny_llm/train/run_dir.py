"""A run directory's own rules: its lock, which state a run resumes from, the recipe identity of the run it
holds (refused or set aside when it is another's), whether that run is finished, and status.json.

The training loop asks these; nothing here trains.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiny_llm.config import RecipeConfig, identity_differences, recipe_identity_payload
from tiny_llm.errors import RunStateError
from tiny_llm.io import REPLACED_INFIX, atomic_write_json, fsync_dir, read_json
from tiny_llm.train import checkpoint
from tiny_llm.train.metrics import RunLog

LOCK_FILE = ".lock"


def remove_stale_temps(run_dir: Path) -> None:
    """Temp files of a writer killed mid-write (the caller holds the lock, so none is being written)."""
    for stale in run_dir.glob(".*.tmp"):
        stale.unlink(missing_ok=True)


def check_resumable(
    state: dict[str, Any], path: Path | None, recipe: RecipeConfig, identity: str, cache_identity: str
) -> None:
    """A state of another recipe or token cache is refused, naming what changed."""
    if state["recipe_identity"] == identity:
        return
    diffs = identity_differences(state["identity_payload"], recipe_identity_payload(recipe))
    if state.get("cache_identity") != cache_identity:
        diffs.append(f"token cache identity {state.get('cache_identity')} -> {cache_identity}")
    raise RunStateError(
        f"cannot resume {path}: the recipe changed ({'; '.join(diffs) or 'identity'}); "
        "restore the original recipe or use a new runtime.output_dir"
    )


def write_status(run_dir: Path, status: str, step: int, tokens: int, **extra: Any) -> None:
    body = {"status": status, "step": step, "tokens": tokens, **extra}
    atomic_write_json(run_dir / "status.json", body)


def resolve_resume(
    run_dir: Path, resume: str | None, log: RunLog
) -> tuple[Path | None, dict[str, Any] | None]:
    """(state file, its state if already loaded): --resume PATH -> that file; auto -> the newest state that
    loads and passes its checksums (damaged ones set aside, one line each), or a fresh start; absent ->
    refuse to clobber existing state."""
    if resume == "auto":
        return checkpoint.newest_usable_state(run_dir, log)
    if resume:
        return Path(resume), None
    existing = checkpoint.state_candidates(run_dir)
    if existing:
        raise RunStateError(
            f"{run_dir} already holds training state ({existing[0].name}); pass --resume auto to continue it "
            "or choose a new runtime.output_dir"
        )
    if (run_dir / "result.json").exists():
        raise RunStateError(
            f"{run_dir} already holds a finished run (result.json); choose a new runtime.output_dir "
            "(--resume auto only confirms a run of the same recipe)"
        )
    return None, None


def recorded_identity(run_dir: Path) -> str | None:
    """The recipe identity of the run ``run_dir`` holds: result.json's, else environment.json's (written
    when the run started); None where no run has started."""
    for name in ("result.json", "environment.json"):
        try:
            identity = read_json(run_dir / name).get("recipe_identity")
        except (OSError, ValueError, AttributeError):
            continue
        if identity:
            return str(identity)
    return None


def set_aside_run(run_dir: Path, keep: Sequence[Path] = ()) -> Path:
    """Move the run ``run_dir`` holds into a new sibling ``<name>.replaced-N`` (first free N), all but the
    lock file and ``keep`` (the recipe files of the run about to start); nothing is deleted."""
    kept = {os.path.abspath(path) for path in (*keep, run_dir / LOCK_FILE)}
    number = 1
    while True:
        aside = run_dir.with_name(f"{run_dir.name}{REPLACED_INFIX}{number}")
        try:
            aside.mkdir()
            break
        except FileExistsError:
            number += 1
    for entry in sorted(run_dir.iterdir()):
        if os.path.abspath(entry) not in kept:
            os.rename(entry, aside / entry.name)
    fsync_dir(aside)
    fsync_dir(run_dir)
    return aside


def check_identity(
    run_dir: Path, identity: str, log: RunLog, set_aside_changed: bool, keep: Sequence[Path]
) -> None:
    """A directory holding a run of another recipe is refused, or with ``set_aside_changed`` moved aside:
    a resume never mixes two identities, and no run's files are overwritten."""
    previous = recorded_identity(run_dir)
    if previous is None or previous == identity:
        return
    if not set_aside_changed:
        raise RunStateError(
            f"{run_dir} holds a run of another recipe (identity {previous[:12]}, this one {identity[:12]}); "
            "choose a new runtime.output_dir or move that run away"
        )
    aside = set_aside_run(run_dir, keep)
    log(
        f"{run_dir} held a run of another recipe (identity {previous[:12]}); kept as {aside}; starting afresh"
    )


def already_complete(run_dir: Path, identity: str) -> bool:
    """A finished run of the same recipe (status complete and result.json with this identity)."""
    try:
        status, result = read_json(run_dir / "status.json"), read_json(run_dir / "result.json")
    except (OSError, ValueError):
        return False
    return status.get("status") == "complete" and result.get("recipe_identity") == identity
