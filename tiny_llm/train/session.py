"""A training session: the run directory claimed and locked, the state to resume from chosen, and the
trainer's exit code (``tiny_llm.train.loop``)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tiny_llm.config import RecipeConfig
from tiny_llm.errors import DiskFullError, RunStateError
from tiny_llm.io import exclusive_lock
from tiny_llm.runtime import signals
from tiny_llm.runtime.engine import EngineFactory, NonFiniteError
from tiny_llm.train.distributed import RankLostError
from tiny_llm.train.loop import EXIT_COMPLETE, Interrupted, Trainer
from tiny_llm.train.metrics import RunLog
from tiny_llm.train.run_dir import (
    LOCK_FILE,
    already_complete,
    check_identity,
    claim_run_dir,
    remove_stale_temps,
    resolve_resume,
)


@dataclass(frozen=True)
class Continuation:
    """Where a run stops and which states it keeps (a trunk), or the state it starts from (a branch)."""

    stop_at_step: int | None = None
    keep_states_at: tuple[int, ...] = ()
    from_state: Path | None = None


def run_training(
    recipe: RecipeConfig,
    build_engine: EngineFactory,
    resume: str | None = None,
    quiet: bool = False,
    plan: Continuation | None = None,
    *,
    set_aside_changed: bool = False,
    keep: Sequence[Path] = (),
) -> int:
    """Train ``recipe`` into runtime.output_dir with engines from ``build_engine``; see the module doc for
    exit codes. ``tiny_llm.engines.run_training`` passes the engine the recipe needs. ``plan``: stop early
    keeping states, or start from another run's state when the directory holds none. A directory holding a
    run of another recipe is refused, or with ``set_aside_changed`` renamed aside (see check_identity)."""
    plan = plan or Continuation()
    run_dir = claim_run_dir(Path(recipe.runtime.output_dir), keep)  # refuses before the lock file
    log = RunLog(run_dir / "run.log", quiet=quiet)
    with exclusive_lock(run_dir / LOCK_FILE, f"run directory {run_dir}"), signals.stop_on_signals():
        remove_stale_temps(run_dir)
        given = None if resume == "auto" else resolve_resume(run_dir, resume, log)  # refuses before any work
        trainer = Trainer(recipe, run_dir, log, build_engine)
        trainer.stop_at, trainer.keep_at = plan.stop_at_step, set(plan.keep_states_at)
        state_file = None if given is None else given[0]
        if state_file is None or state_file.resolve().parent != run_dir.resolve():
            # (an explicit resume from this directory's own state is refused by the state's own check,
            # which names the key that changed)
            check_identity(run_dir, trainer.identity, log, set_aside_changed, keep)
        if resume == "auto" and already_complete(run_dir, trainer.identity):
            log(f"{run_dir} is already complete")
            return EXIT_COMPLETE
        try:
            path, state = given if given is not None else resolve_resume(run_dir, resume, log)
            if path is None and plan.from_state is not None:
                trainer.start(plan.from_state, branch=True)
            else:
                trainer.start(path, state)
            return trainer.run()
        except Interrupted:
            return trainer.interrupt()
        except (NonFiniteError, DiskFullError, RankLostError) as exc:  # one line each: no traceback to add
            return trainer.fail(str(exc))
        except RunStateError:
            raise
        except Exception as exc:
            if not trainer.started:
                raise
            log(traceback.format_exc())
            return trainer.fail(f"{type(exc).__name__}: {exc}")
        finally:
            with contextlib.suppress(Exception):
                trainer.close()
