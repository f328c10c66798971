"""Campaign settings, stages and run ids: every run id is known before anything trains."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from tiny_llm.config import MuonConfig, OptimizerConfig, OptimizerName
from tiny_llm.errors import ConfigError
from tiny_llm.typed import NON_NEGATIVE, bounds, typed_from_dict

# The optimizer keys a stage may vary, in the tie order of a ranking (after the loss) and of a run id.
GRID_KEYS = ("lr", "weight_decay", "beta1", "beta2")
POINT_KEYS = (*GRID_KEYS, "name", "muon_lr")
"""The keys an explicit grid point may set: the grid keys, then the optimizer's name and Muon's peak LR
(``muon_lr``: the optimizer's ``muon.lr``; ``optimizer_values``)."""
_ID_PARTS = {
    "lr": "lr{}",
    "weight_decay": "wd{}",
    "beta1": "beta1-{}",
    "beta2": "beta2-{}",
    "name": "{}",
    "muon_lr": "mlr{}",
}
DEFAULT_OPTIMIZER = "adamw"
NAME_PATTERN = r"^(?!.*[.]replaced-)[A-Za-z0-9][A-Za-z0-9._-]*(?![\s\S])"
"""A size or run name: one path segment (no '/', no leading '.'), never a set-aside ``<run>.replaced-N``;
the workflow schema's ``$defs/name`` is this pattern."""


def check_name(key: str, name: object) -> None:
    """Refuse a name that is not one plain path segment (``../X`` would write outside the campaign root)."""
    if not isinstance(name, str) or not re.search(NAME_PATTERN, name):
        raise ConfigError(
            f"{key}: {name!r} is not a valid name (letters, digits, '.', '_', '-'; starting with a letter "
            "or digit); rename it"
        )


@dataclass(frozen=True, kw_only=True)
class StageConfig:
    """One promotion stage: a grid of configurations, each trained once per seed."""

    size: str
    """Size name (a key of the workflow's ``sizes``)."""
    lr: tuple[float, ...] = ()
    """Peak learning rates of the grid (stage 1: required unless ``points``)."""
    weight_decay: tuple[float, ...] = ()
    """Weight decays of the grid."""
    beta1: tuple[float, ...] = ()
    """AdamW beta1 values of the grid (empty = the template's, or the parent's)."""
    beta2: tuple[float, ...] = ()
    """Stage 1: beta2 values of the grid; later stages: beta2 values per parent (empty = copy it)."""
    points: tuple[tuple[tuple[str, float | str], ...], ...] = ()
    """Explicit grid points instead of the lists' product: (key, value) tuples in POINT_KEYS order."""
    parents: int = 0
    """Later stages: how many of the previous stage's best configurations are promoted."""
    seeds: tuple[int, ...] = ()
    """runtime.seed of each run of a configuration (empty = one run with the template's seed, or, in a later
    stage, the seeds of the stage before)."""


@dataclass(frozen=True, kw_only=True)
class TieRule:
    """``campaign.promotion.resolve_ties``: seeds added where a promotion cut is inside the noise."""

    extra_seeds: int = field(metadata={"minimum": 1})
    """Seeds added per round to every configuration on either side of the cut (``significance.contested``)."""
    max_rounds: int = field(default=1, metadata={"minimum": 1})
    """Rounds of extra seeds at most; the top configurations by mean go on after the last, held or not."""


@dataclass(frozen=True, kw_only=True)
class PromotionSection:
    """``campaign.promotion`` as written."""

    resolve_ties: TieRule | None = None


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
    resolve_ties: TieRule | None = None
    """Opt-in: re-test a cut inside the noise with extra seeds before promoting (None: top ``parents`` by
    mean, the reference's rule)."""


def stage_name(index: int) -> str:
    """0-based stage index -> directory name (``stage1``...)."""
    return f"stage{index + 1}"


def optimizer_range(key: str) -> Any:
    """A grid key's values range as the optimizer's field does (its bounds live there; muon_lr: muon.lr's)."""
    section, name = (MuonConfig, "lr") if key == "muon_lr" else (OptimizerConfig, key)
    return field(default=None, metadata=bounds(next(f for f in fields(section) if f.name == name)))


def optimizer_values(point: Mapping[str, float | str]) -> dict[str, Any]:
    """A grid point's values as keys of an optimizer block (``muon_lr`` is its ``muon.lr``)."""
    values: dict[str, Any] = {k: v for k, v in point.items() if k != "muon_lr"}
    if "muon_lr" in point:
        values["muon"] = {"lr": point["muon_lr"]}
    return values


@dataclass(frozen=True, kw_only=True)
class GridPoint:
    """One explicit grid point as written: some of the optimizer keys a stage varies."""

    lr: float | None = optimizer_range("lr")
    weight_decay: float | None = optimizer_range("weight_decay")
    beta1: float | None = optimizer_range("beta1")
    beta2: float | None = optimizer_range("beta2")
    name: OptimizerName | None = None
    """optimizer.name of the point (adamw, the default, is left out of its run id)."""
    muon_lr: float | None = optimizer_range("muon_lr")
    """optimizer.muon.lr: peak LR of the hidden matrices under muon."""


@dataclass(frozen=True, kw_only=True)
class StageSection:
    """One entry of ``campaign.stages`` as written; ``_stage`` checks its values and makes a StageConfig."""

    size: str
    lr: list[float] | None = optimizer_range("lr")
    weight_decay: list[float] | None = optimizer_range("weight_decay")
    beta1: list[float] | None = optimizer_range("beta1")
    beta2: list[float] | None = optimizer_range("beta2")
    points: list[GridPoint] | None = None
    parents: int | None = field(default=None, metadata={"minimum": 1})
    seeds: list[int] | None = field(default=None, metadata=NON_NEGATIVE)


def _numbers(values: list[float], key: str) -> tuple[float, ...]:
    if not values:
        raise ConfigError(f"{key}: expected a non-empty list of numbers, got {values!r}")
    return tuple(_distinct(values, key))


def _distinct(values: list[Any], key: str) -> list[Any]:
    if len({repr(v) for v in values}) != len(values):
        raise ConfigError(f"{key}: values repeat ({values!r})")
    return values


def _seeds(value: list[int] | None, key: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not value:
        raise ConfigError(f"{key}: expected a non-empty list of seeds, got {value!r}")
    return tuple(_distinct(value, key))


def _points(value: list[GridPoint], key: str) -> tuple[tuple[tuple[str, float | str], ...], ...]:
    if not value:
        raise ConfigError(f"{key}: expected a non-empty list of mappings, got {value!r}")
    points = []
    for i, point in enumerate(value):
        given = {k: v for k, v in vars(point).items() if v is not None}
        if not given:
            raise ConfigError(f"{key}[{i}]: name some of {', '.join(POINT_KEYS)}")
        points.append(tuple((k, given[k]) for k in POINT_KEYS if k in given))
    return tuple(_distinct(points, key))


def _stage(raw: Any, index: int) -> StageConfig:
    key = f"campaign.stages[{index}]"
    section = typed_from_dict(StageSection, raw, key)
    seeds = _seeds(section.seeds, f"{key}.seeds")
    lists = {name: getattr(section, name) for name in GRID_KEYS if getattr(section, name) is not None}
    points: tuple[tuple[tuple[str, float | str], ...], ...] = ()
    if section.points is not None:
        if lists:
            raise ConfigError(f"{key}: give either points or lists ({', '.join(lists)}), not both")
        points = _points(section.points, f"{key}.points")
    elif index == 0:  # the reference grid's defaults: weight decay 0.1, beta2 0.95 (not the preset's)
        if section.lr is None:
            raise ConfigError(f"{key}.lr: expected a non-empty list of numbers (or points), got null")
        lists = {"weight_decay": [0.1], "beta2": [0.95], **lists}
    grid: dict[str, Any] = {name: _numbers(values, f"{key}.{name}") for name, values in lists.items()}
    if index == 0:
        if section.parents is not None:
            raise ConfigError(f"{key}.parents: the first stage has no stage before it to promote from")
        return StageConfig(size=section.size, points=points, seeds=seeds, **grid)
    if section.parents is None:
        raise ConfigError(f"{key}.parents: expected a positive integer, got None")
    return StageConfig(size=section.size, parents=section.parents, points=points, seeds=seeds, **grid)


def parse_campaign(
    section: Mapping[str, Any], sizes: Mapping[str, Any], root: str, numerics_version: int = 0
) -> CampaignConfig:
    """Validate the workflow's ``campaign`` section against its ``sizes`` (ConfigError on a problem)."""
    for name in sizes:
        check_name(f"sizes.{name}", name)
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
        before = len(_stage_configurations(stages, i - 1)) if i else 0
        if i and stage.parents > before:
            raise ConfigError(
                f"campaign.stages[{i}].parents: {stage.parents} exceeds the "
                f"{before} configurations of {stage_name(i - 1)}"
            )
        ids = [run.run_id for run in _stage_runs(stages, i)]
        repeated = sorted({r for r in ids if ids.count(r) > 1})
        if repeated:
            raise ConfigError(
                f"campaign.stages[{i}]: run ids repeat ({', '.join(repeated[:3])}); give distinct grid values"
            )
    for key in ("batch_tokens", "tuning", "throughput"):
        extra = sorted(set(section.get(key) or {}) - set(used))
        if extra:
            raise ConfigError(f"campaign.{key}: size(s) {', '.join(extra)} are not in campaign.stages")
    ties = _tie_rule(section.get("promotion"), stages)
    return CampaignConfig(
        root=root.rstrip("/"),
        stages=stages,
        sizes={name: sizes[name] for name in dict.fromkeys(used)},
        overrides=dict(section.get("overrides") or {}),
        batch_tokens=dict(section.get("batch_tokens") or {}),
        tuning=dict(section.get("tuning") or {}),
        throughput={k: float(v) for k, v in (section.get("throughput") or {}).items()},
        numerics_version=numerics_version,
        resolve_ties=ties,
    )


def _tie_rule(raw: Any, stages: Sequence[StageConfig]) -> TieRule | None:
    """``campaign.promotion``'s tie rule, checked: positive counts, and no planned run named like an extra."""
    rule = typed_from_dict(PromotionSection, raw or {}, "campaign.promotion").resolve_ties
    if rule is None:
        return None
    for i in range(len(stages)):
        clash = [r for r in stage_run_ids_of(stages, i) if parse_tie_run(r)]
        if clash:
            raise ConfigError(
                f"campaign.stages[{i}]: run id {clash[0]} looks like an extra seed's of "
                "campaign.promotion.resolve_ties (<configuration>-tie<round>-s<seed>); rename the size"
            )
    return rule


def _stage_dict(stage: StageConfig) -> dict[str, Any]:
    """A stage as JSON; keys at their default are left out, so a campaign planned before they existed keeps
    its identity."""
    out: dict[str, Any] = {}
    for key, value in vars(stage).items():
        if value in ((), 0):
            continue
        if key == "points":
            out[key] = [dict(point) for point in value]
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def settings_dict(config: CampaignConfig) -> dict[str, Any]:
    """A JSON-ready form of the settings (what the workflow hands to the CLI)."""
    return {
        "root": config.root,
        "stages": [_stage_dict(s) for s in config.stages],
        "sizes": {k: dict(v) for k, v in config.sizes.items()},
        "overrides": dict(config.overrides),
        "batch_tokens": dict(config.batch_tokens),
        "tuning": dict(config.tuning),
        "throughput": dict(config.throughput),
        "numerics_version": config.numerics_version,
        **({"promotion": {"resolve_ties": vars(config.resolve_ties)}} if config.resolve_ties else {}),
    }


def config_from_settings(settings: Mapping[str, Any]) -> CampaignConfig:
    """Inverse of ``settings_dict``."""
    keys = ("stages", "overrides", "batch_tokens", "tuning", "throughput", "promotion")
    section = {k: settings.get(k) for k in keys}
    return parse_campaign(section, settings["sizes"], settings["root"], settings.get("numerics_version", 0))


# -----------------------------------------------------------------------------  run ids


def format_value(value: float) -> str:
    """Short, stable number text for run ids: 0.001, 0.0003, 0, 0.95, 1e-05, 1e20 (no '+', which no
    wildcard of the rules matches)."""
    return f"{value:.10g}".replace("e+", "e")


@dataclass(frozen=True)
class PlannedConfiguration:
    """One grid point of a stage (a configuration); it trains once per seed."""

    configuration: str
    """Its id: the run id of its runs without the seed suffix."""
    optimizer: Mapping[str, float | str]
    """Stage 1: the grid point; later stages: the values set on top of the parent's optimizer block."""
    parent_rank: int | None = None
    """Later stages: rank (0 = best) of the parent configuration in the previous stage."""


@dataclass(frozen=True)
class PlannedRun:
    """One run of a stage (a configuration with one seed), known before anything trains."""

    run_id: str
    stage: str
    size: str
    optimizer: Mapping[str, float | str]
    """Stage 1: the grid point; later stages: the values set on top of the parent's optimizer block."""
    parent_rank: int | None = None
    """Later stages: rank (0 = best) of the parent configuration in the previous stage."""
    configuration: str = ""
    """The configuration's id (the run id without the seed suffix)."""
    seed: int | None = None
    """runtime.seed of the run; None = the template's (a stage without seeds)."""


def _id_text(value: float | str) -> str:
    return value if isinstance(value, str) else format_value(value)


def _id(prefix: str, values: Mapping[str, float | str], keys: Sequence[str]) -> str:
    return prefix + "".join(f"-{_ID_PARTS[k].format(_id_text(values[k]))}" for k in keys)


def _point_keys(point: Mapping[str, float | str]) -> list[str]:
    """The keys an explicit point's run id names: those it sets, but the optimizer name at its default."""
    return [k for k in POINT_KEYS if k in point and not (k == "name" and point[k] == DEFAULT_OPTIMIZER)]


def _product(stage: StageConfig) -> list[dict[str, float | str]]:
    lists = [(k, getattr(stage, k)) for k in GRID_KEYS if getattr(stage, k)]
    if stage.points:
        return [dict(point) for point in stage.points]
    return [
        dict(zip([k for k, _ in lists], combo, strict=True))
        for combo in itertools.product(*(v for _, v in lists))
    ]


def _stage_configurations(stages: Sequence[StageConfig], index: int) -> list[PlannedConfiguration]:
    """A stage's configurations in grid order (later stages: parent rank first, then grid order).

    Run ids name:

    1. in stage 1, lr and weight decay always, beta1 and beta2 where their list has several values
       (``20m-lr0.001-wd0.1``, ``20m-lr0.001-wd0.1-beta2-0.98``);
    2. in a later stage, the parent's rank and every listed key (``50m-parent0-beta2-0.99``);
    3. for an explicit point, the keys it sets (``20m-lr0.0056-muon-mlr0.0028``; ``name: adamw`` is not
       named).
    """
    stage = stages[index]
    points = _product(stage)
    if index == 0:
        if stage.points:
            keys_of = [_point_keys(p) for p in points]
        else:
            named = [k for k in GRID_KEYS if k in ("lr", "weight_decay") or len(getattr(stage, k)) > 1]
            keys_of = [[k for k in named if k in p] for p in points]
        return [
            PlannedConfiguration(_id(stage.size, p, keys), p) for p, keys in zip(points, keys_of, strict=True)
        ]
    configurations = []
    for rank in range(stage.parents):
        for p in points:
            keys = _point_keys(p)
            configurations.append(PlannedConfiguration(_id(f"{stage.size}-parent{rank}", p, keys), p, rank))
    return configurations


def stage_seeds(stages: Sequence[StageConfig], index: int) -> tuple[int, ...]:
    """The seeds of stage ``index``: its own, else those of the stage before (promotion keeps the seeds)."""
    for stage in reversed(stages[: index + 1]):
        if stage.seeds:
            return stage.seeds
    return ()


def seed_run_id(configuration: str, seed: int | None) -> str:
    """``50m-parent0-beta2-0.99`` + seed 43 -> ``50m-parent0-beta2-0.99-s43`` (no seed: unchanged)."""
    return configuration if seed is None else f"{configuration}-s{seed}"


def _stage_runs(stages: Sequence[StageConfig], index: int) -> list[PlannedRun]:
    stage, name = stages[index], stage_name(index)
    seeds: Sequence[int | None] = stage_seeds(stages, index) or (None,)
    return [
        PlannedRun(
            seed_run_id(c.configuration, seed),
            name,
            stage.size,
            c.optimizer,
            c.parent_rank,
            c.configuration,
            seed,
        )
        for c in _stage_configurations(stages, index)
        for seed in seeds
    ]


def stage_run_ids_of(stages: Sequence[StageConfig], index: int) -> list[str]:
    return [run.run_id for run in _stage_runs(stages, index)]


def planned_runs(config: CampaignConfig) -> dict[str, list[PlannedRun]]:
    """Stage name -> its runs, configuration by configuration (grid / parent-rank order), seeds within."""
    return {stage_name(i): _stage_runs(config.stages, i) for i in range(len(config.stages))}


def planned_configurations(config: CampaignConfig) -> dict[str, list[PlannedConfiguration]]:
    """Stage name -> its configurations in grid / parent-rank order."""
    return {stage_name(i): _stage_configurations(config.stages, i) for i in range(len(config.stages))}


def configuration_runs(config: CampaignConfig, stage: str) -> dict[str, list[str]]:
    """Configuration id -> its run ids (one per seed) for one stage."""
    members: dict[str, list[str]] = {}
    for run in planned_runs(config)[stage]:
        members.setdefault(run.configuration, []).append(run.run_id)
    return members


def run_dir(config: CampaignConfig, stage: str, run_id: str) -> str:
    return f"{config.root}/{stage}/{run_id}"


def recipe_path(config: CampaignConfig, stage: str, run_id: str) -> str:
    return f"{run_dir(config, stage, run_id)}/recipe.yaml"


def template_path(config: CampaignConfig, size: str) -> str:
    return f"{config.root}/templates/{size}.yaml"


def ranking_path(config: CampaignConfig, stage: str) -> str:
    return f"{config.root}/{stage}/ranking.json"


def promoted_count(config: CampaignConfig, index: int) -> int:
    """How many configurations of stage ``index`` (0-based) go on: the next stage's ``parents``; the last
    stage's best is the selection (its export, its selected recipe)."""
    if index + 1 < len(config.stages):
        return config.stages[index + 1].parents
    return 1


# -----------------------------------------------------------------------------  extra seeds at a cut

TIE_RUN = r".+-tie[1-9][0-9]*-s[0-9]+"
"""An extra seed's run id: ``<configuration>-tie<round>-s<seed>`` (``campaign.promotion.resolve_ties``); a
plain regex, as a Snakemake wildcard constraint takes it."""
_TIE_RUN_PARTS = re.compile(r"(.+)-tie([1-9][0-9]*)-s([0-9]+)")


def tie_run_id(configuration: str, round_: int, seed: int) -> str:
    return f"{configuration}-tie{round_}-s{seed}"


def parse_tie_run(run_id: str) -> tuple[str, int, int] | None:
    """(configuration, round, seed) of an extra seed's run id; None for any other run id."""
    match = _TIE_RUN_PARTS.fullmatch(run_id)
    if match is None:
        return None
    return match[1], int(match[2]), int(match[3])


def tie_rounds(config: CampaignConfig, index: int) -> list[int]:
    """The tie-resolving rounds stage ``index`` may take (1-based; none without the rule, or when its cut
    promotes every configuration)."""
    rule = config.resolve_ties
    if rule is None or promoted_count(config, index) >= len(_stage_configurations(config.stages, index)):
        return []
    return list(range(1, rule.max_rounds + 1))


def tie_round_path(config: CampaignConfig, stage: str, round_: int) -> str:
    """Round ``round_``'s decision at ``stage``'s cut: which configurations get which extra seeds."""
    return f"{config.root}/{stage}/ties/round-{round_}.json"


def first_run_of(config: CampaignConfig, stage: str, configuration: str) -> str:
    """The first planned run of a configuration (an extra seed copies its recipe)."""
    for run in planned_runs(config)[stage]:
        if run.configuration == configuration:
            return run.run_id
    raise ConfigError(f"{configuration} is not a configuration of {stage} in {config.root}")
