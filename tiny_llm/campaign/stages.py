"""Campaign settings, stages and run ids: every run id is known before anything trains."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiny_llm.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class StageConfig:
    """One promotion stage."""

    size: str
    """Size name (a key of the workflow's ``sizes``)."""
    lr: tuple[float, ...] = ()
    """Stage 1 only: peak learning rates of the grid."""
    weight_decay: tuple[float, ...] = ()
    """Stage 1 only: weight decays of the grid."""
    beta2: tuple[float, ...] = ()
    """Stage 1: beta2 values of the grid; later stages: beta2 values per parent (empty = copy it)."""
    parents: int = 0
    """Later stages: how many of the previous stage's best runs are promoted."""


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    """Everything that decides which runs a campaign trains and how."""

    root: str
    """Campaign directory (``results/campaign``)."""
    stages: tuple[StageConfig, ...]
    sizes: Mapping[str, Mapping[str, Any]]
    """Size name -> {preset, overrides} (the workflow's ``sizes`` entries)."""
    overrides: Mapping[str, Any]
    """Recipe overrides applied to every campaign run."""
    batch_tokens: Mapping[str, int]
    """Size name -> optimizer batch tokens of its campaign runs."""
    tuning: Mapping[str, str]
    """Size name -> tuning ``selected.yaml`` whose execution settings the size's runs use."""
    throughput: Mapping[str, float]
    """Size name -> tokens/s assumed for the GPU-hour estimate when no tuning result gives it."""
    numerics_version: int = 0
    """The workflow's NUMERICS_VERSION: a bump means results would differ, so it is part of the identity."""


def stage_name(index: int) -> str:
    """0-based stage index -> directory name (``stage1``...)."""
    return f"stage{index + 1}"


def _numbers(value: Any, key: str, *, positive: bool) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a non-empty list of numbers, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise ConfigError(f"{key}: expected finite numbers, got {item!r}")
        if item < 0 or (positive and item == 0):
            sign = "positive" if positive else "non-negative"
            raise ConfigError(f"{key}: expected {sign} numbers, got {item}")
        out.append(float(item))
    if len(set(out)) != len(out):
        raise ConfigError(f"{key}: values repeat ({value!r})")
    return tuple(out)


def _stage(raw: Any, index: int) -> StageConfig:
    key = f"campaign.stages[{index}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("size"), str):
        raise ConfigError(f"{key}: expected a mapping with a 'size' name, got {raw!r}")
    allowed = {"size", "lr", "weight_decay", "beta2"} if index == 0 else {"size", "parents", "beta2"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        names = ", ".join(sorted(allowed))
        raise ConfigError(f"{key}: unknown key(s) {', '.join(unknown)} (allowed: {names})")
    if index == 0:
        return StageConfig(
            size=raw["size"],
            lr=_numbers(raw.get("lr"), f"{key}.lr", positive=True),
            weight_decay=_numbers(raw.get("weight_decay", [0.1]), f"{key}.weight_decay", positive=False),
            beta2=_numbers(raw.get("beta2", [0.95]), f"{key}.beta2", positive=False),
        )
    parents = raw.get("parents")
    if isinstance(parents, bool) or not isinstance(parents, int) or parents < 1:
        raise ConfigError(f"{key}.parents: expected a positive integer, got {parents!r}")
    beta2 = _numbers(raw["beta2"], f"{key}.beta2", positive=False) if raw.get("beta2") is not None else ()
    return StageConfig(size=raw["size"], parents=parents, beta2=beta2)


def parse_campaign(
    section: Mapping[str, Any], sizes: Mapping[str, Any], root: str, numerics_version: int = 0
) -> CampaignConfig:
    """Validate the workflow's ``campaign`` section against its ``sizes`` (ConfigError on a problem)."""
    raw_stages = section.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ConfigError("campaign.stages: expected a non-empty list of stages")
    stages = tuple(_stage(raw, i) for i, raw in enumerate(raw_stages))
    used = [s.size for s in stages]
    for i, stage in enumerate(stages):
        if stage.size not in sizes:
            raise ConfigError(
                f"campaign.stages[{i}].size: unknown size '{stage.size}' (sizes: {', '.join(sorted(sizes))})"
            )
        if i and stage.parents > len(stage_run_ids_of(stages, i - 1)):
            raise ConfigError(
                f"campaign.stages[{i}].parents: {stage.parents} exceeds the "
                f"{len(stage_run_ids_of(stages, i - 1))} runs of {stage_name(i - 1)}"
            )
    for key in ("batch_tokens", "tuning", "throughput"):
        extra = sorted(set(section.get(key) or {}) - set(used))
        if extra:
            raise ConfigError(f"campaign.{key}: size(s) {', '.join(extra)} are not in campaign.stages")
    return CampaignConfig(
        root=root.rstrip("/"),
        stages=stages,
        sizes={name: sizes[name] for name in dict.fromkeys(used)},
        overrides=dict(section.get("overrides") or {}),
        batch_tokens=dict(section.get("batch_tokens") or {}),
        tuning=dict(section.get("tuning") or {}),
        throughput={k: float(v) for k, v in (section.get("throughput") or {}).items()},
        numerics_version=numerics_version,
    )


def settings_dict(config: CampaignConfig) -> dict[str, Any]:
    """A JSON-ready form of the settings (what the workflow hands to the CLI)."""
    return {
        "root": config.root,
        "stages": [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(s).items() if v not in ((), 0)}
            for s in config.stages
        ],
        "sizes": {k: dict(v) for k, v in config.sizes.items()},
        "overrides": dict(config.overrides),
        "batch_tokens": dict(config.batch_tokens),
        "tuning": dict(config.tuning),
        "throughput": dict(config.throughput),
        "numerics_version": config.numerics_version,
    }


def config_from_settings(settings: Mapping[str, Any]) -> CampaignConfig:
    """Inverse of ``settings_dict``."""
    section = {k: settings.get(k) for k in ("stages", "overrides", "batch_tokens", "tuning", "throughput")}
    return parse_campaign(section, settings["sizes"], settings["root"], settings.get("numerics_version", 0))


# -----------------------------------------------------------------------------  run ids


def format_value(value: float) -> str:
    """Short, stable number text for run ids: 0.001, 0.0003, 0, 0.95, 1e-05."""
    return f"{value:.10g}"


@dataclass(frozen=True)
class PlannedRun:
    """One run of a stage, known before anything trains."""

    run_id: str
    stage: str
    size: str
    optimizer: Mapping[str, float]
    """Stage 1: the grid point; later stages: the values set on top of the parent's optimizer block."""
    parent_rank: int | None = None
    """Later stages: rank (0 = best) of the parent in the previous stage."""


def _stage_runs(stages: Sequence[StageConfig], index: int) -> list[PlannedRun]:
    stage, name = stages[index], stage_name(index)
    if index == 0:
        many_beta2 = len(stage.beta2) > 1
        runs = []
        for lr, wd, beta2 in itertools.product(stage.lr, stage.weight_decay, stage.beta2):
            run_id = f"{stage.size}-lr{format_value(lr)}-wd{format_value(wd)}"
            if many_beta2:
                run_id += f"-beta2-{format_value(beta2)}"
            runs.append(PlannedRun(run_id, name, stage.size, {"lr": lr, "weight_decay": wd, "beta2": beta2}))
        return runs
    runs = []
    for rank in range(stage.parents):
        if not stage.beta2:
            runs.append(PlannedRun(f"{stage.size}-parent{rank}", name, stage.size, {}, rank))
        for beta2 in stage.beta2:
            run_id = f"{stage.size}-parent{rank}-beta2-{format_value(beta2)}"
            runs.append(PlannedRun(run_id, name, stage.size, {"beta2": beta2}, rank))
    return runs


def stage_run_ids_of(stages: Sequence[StageConfig], index: int) -> list[str]:
    return [run.run_id for run in _stage_runs(stages, index)]


def planned_runs(config: CampaignConfig) -> dict[str, list[PlannedRun]]:
    """Stage name -> its runs, in grid / parent-rank order."""
    return {stage_name(i): _stage_runs(config.stages, i) for i in range(len(config.stages))}


def run_dir(config: CampaignConfig, stage: str, run_id: str) -> str:
    return f"{config.root}/{stage}/{run_id}"


def recipe_path(config: CampaignConfig, stage: str, run_id: str) -> str:
    return f"{run_dir(config, stage, run_id)}/recipe.yaml"


def template_path(config: CampaignConfig, size: str) -> str:
    return f"{config.root}/templates/{size}.yaml"


def ranking_path(config: CampaignConfig, stage: str) -> str:
    return f"{config.root}/{stage}/ranking.json"
