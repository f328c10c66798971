"""Live tracking: every metrics.jsonl row also goes to TensorBoard and/or Weights & Biases.

The recipe's ``tracking`` section (or, where it is unset, ``$TINY_LLM_TRACKING``: the same section as JSON,
which the workflow sets from its own ``tracking`` section) names the trackers. With neither, nothing is
imported. Trackers are optional extras (``pip install -e ".[tracking]"``); one that fails to start or to log
(a missing package, a network error) is reported once in run.log and dropped, and training goes on. Both
write asynchronously (TensorBoard's writer thread, W&B's service process), so logging costs no update time.

Each row becomes scalars ``<event>/<field>`` (``train/loss``, ``validation/perplexity``,
``final_validation/loss``) at its update step; the run's recipe and identity are the run's config.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_llm.config import TRACKING_ENV, RecipeConfig, TrackingConfig, recipe_from_dict, recipe_to_dict
from tiny_llm.errors import ConfigError

_SEED_SUFFIX = re.compile(r"-s\d+$")


def tracking_settings(recipe: RecipeConfig) -> TrackingConfig | None:
    """The recipe's tracking section, else the one in $TINY_LLM_TRACKING (validated as a recipe's)."""
    if recipe.tracking is not None:
        return recipe.tracking
    text = os.environ.get(TRACKING_ENV, "").strip()
    if not text:
        return None
    try:
        return recipe_from_dict({"tracking": json.loads(text)}).tracking
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"${TRACKING_ENV}: {exc}") from None


def run_name_and_group(settings: TrackingConfig, run_dir: Path) -> tuple[str, str]:
    """Name: the run directory's (a run id); group: <stage or parent dir>/<run id without -sNN>."""
    resolved = run_dir.resolve()
    name = settings.name or resolved.name
    group = settings.group or f"{resolved.parent.name}/{_SEED_SUFFIX.sub('', resolved.name)}"
    return name, group


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers as ``<event>/<field>`` (step, flags and texts left out)."""
    event = row.get("event", "row")
    return {
        f"{event}/{key}": float(value)
        for key, value in row.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


class Tracker:
    """Fans rows out to the started trackers; a tracker that raises is reported once and dropped."""

    def __init__(self, sinks: list[Any], warn: Callable[[str], None]) -> None:
        self.sinks = sinks
        self.warn = warn

    def log_row(self, row: dict[str, Any]) -> None:
        if self.sinks:
            self._each("log", row.get("step", 0), scalars(row))

    def close(self) -> None:
        self._each("close")
        self.sinks = []

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # a tracker never stops a run
                self.sinks.remove(sink)
                self.warn(
                    f"tracking: {sink.kind} failed and is off for this run ({type(exc).__name__}: {exc})"
                )


class TensorBoardSink:
    kind = "tensorboard"

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    kind = "wandb"

    def __init__(self, settings: TrackingConfig, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        name, group = run_name_and_group(settings, run_dir)
        options = settings.wandb
        assert options is not None  # only opened when the wandb section is set
        self.run = wandb.init(
            project=options.project,
            entity=options.entity,
            mode=options.mode,
            dir=str(run_dir),
            name=name,
            group=group,
            job_type="train",
            id=f"{name}-{config['recipe_identity'][:12]}",  # a resumed run continues its W&B run
            resume="allow",
            config=config,
            settings=wandb.Settings(console="off", silent=True, init_timeout=60),
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # waits for W&B's service to write the run's files (offline: all of them)


def open_tracker(recipe: RecipeConfig, run_dir: Path, identity: str, warn: Callable[[str], None]) -> Tracker:
    """The trackers the recipe (or $TINY_LLM_TRACKING) asks for, started; none: imports nothing."""
    settings = tracking_settings(recipe)
    if settings is None:
        return Tracker([], warn)
    config = {"recipe": recipe_to_dict(recipe), "recipe_identity": identity}
    starters: list[tuple[str, Callable[[], Any]]] = []
    if settings.tensorboard:
        starters.append(("tensorboard", lambda: TensorBoardSink(run_dir, config)))
    if settings.wandb is not None and settings.wandb.mode != "disabled":
        starters.append(("wandb", lambda: WandbSink(settings, run_dir, config)))
    sinks = []
    for kind, start in starters:
        try:
            sinks.append(start())
        except Exception as exc:  # e.g. the extra is not installed, or no network
            hint = ' (pip install -e ".[tracking]")' if isinstance(exc, ImportError) else ""
            warn(f"tracking: {kind} did not start and is off for this run{hint}: {type(exc).__name__}: {exc}")
    return Tracker(sinks, warn)
