"""A run directory's own rules: its lock, which state a run resumes from, the recipe identity of the run it
holds (refused or set aside when it is another's), whether that run is finished, status.json and
environment.json.

The training loop asks these; nothing here trains.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tiny_llm.config import RecipeConfig, identity_differences, recipe_identity_payload
from tiny_llm.errors import ConfigError, RunStateError
from tiny_llm.io import REPLACED_INFIX, atomic_write_json, fsync_dir, is_atomic_temp, read_json
from tiny_llm.model import count_parameters
from tiny_llm.runtime.engine import Engine
from tiny_llm.runtime.environment import capture_environment
from tiny_llm.train import checkpoint
from tiny_llm.train.metrics import RunLog

LOCK_FILE = ".lock"
STARTUP_FILES = (LOCK_FILE, "run.log", "resolved.yaml")
"""What a run of ours may hold before its first status.json and environment.json (killed at its start)."""


def check_run_dir_name(run_dir: Path) -> None:
    """Refuse a run directory named like one set aside (``<run>.replaced-N``): every report skips those."""
    if REPLACED_INFIX in run_dir.name:
        raise ConfigError(
            f"runtime.output_dir {run_dir}: a name holding {REPLACED_INFIX!r} is kept for runs set aside, "
            "which reports leave out; choose another name"
        )


def holds_our_run(run_dir: Path, keep: Sequence[Path] = ()) -> bool:
    """Whether ``run_dir`` is new, empty or holds a run of ours: a run's identity (result.json or
    environment.json), its status.json or a training state, or nothing but the files a run writes at its
    start, our temp files and ``keep`` (the recipe a workflow wrote there before training)."""
    if not run_dir.is_dir() or recorded_identity(run_dir) is not None or checkpoint.state_candidates(run_dir):
        return True
    try:
        status = read_json(run_dir / "status.json")
        if isinstance(status, dict) and {"status", "step", "tokens"} <= status.keys():
            return True
    except (OSError, ValueError):
        pass
    kept = {os.path.abspath(path) for path in keep}
    return all(
        entry.name in STARTUP_FILES or is_atomic_temp(entry.name) or os.path.abspath(entry) in kept
        for entry in run_dir.iterdir()
    )


def claim_run_dir(run_dir: Path, keep: Sequence[Path] = ()) -> Path:
    """``run_dir`` created, where its name is a run's and it is new, empty or holds a run of ours; otherwise a
    one-line error before anything is written there (no lock file either)."""
    check_run_dir_name(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunStateError(f"runtime.output_dir {run_dir} exists and is not a directory; choose a new path")
    if not holds_our_run(run_dir, keep):
        raise RunStateError(
            f"runtime.output_dir {run_dir} is a non-empty directory that holds no tiny-llm run; "
            "choose a new or empty directory"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def remove_stale_temps(run_dir: Path) -> None:
    """Temp files of our atomic writes killed mid-write (the caller holds the lock, so none is being
    written); any other file, a user's ``.notes.tmp`` too, stays."""
    for stale in run_dir.glob(".*.tmp"):
        if is_atomic_temp(stale.name):
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


def write_environment(
    run_dir: Path,
    device: torch.device,
    engine: Engine,
    identity: str,
    cache_identity: str,
    compiled: bool,
    *,
    resumed: bool,
) -> None:
    """environment.json of the session that started the run; a resumed session's goes to
    environment-resume.json (the latest resume's), so the first one is kept."""
    env = capture_environment(
        device,
        parameters=count_parameters(engine.eval_model()),
        cache_identity=cache_identity,
        recipe_identity=identity,
        attention_kernels=engine.attention_kernels(),
        compiled=compiled,
    )
    atomic_write_json(run_dir / ("environment-resume.json" if resumed else "environment.json"), env)


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
