"""The campaign's steps on its files: plan, rank a stage, select the next stage's recipes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_llm.campaign.estimate import gpu_hour_estimate, planned_throughput
from tiny_llm.campaign.identity import (
    IDENTITY_FILE,
    campaign_identity,
    campaign_identity_payload,
    check_unchanged,
)
from tiny_llm.campaign.ranking import ConfigurationOutcome, RunOutcome, outcome_from, rank_configurations
from tiny_llm.campaign.stages import (
    CampaignConfig,
    configuration_runs,
    planned_runs,
    recipe_path,
    run_dir,
    settings_dict,
    stage_name,
    stage_seeds,
    template_path,
)
from tiny_llm.campaign.templates import build_template, child_recipes, stage1_recipes
from tiny_llm.errors import (
    REBUILD_CAMPAIGN,
    REBUILD_RESULT,
    REBUILD_TUNING,
    ConfigError,
    DamagedFileError,
    RunStateError,
)
from tiny_llm.io import damaged_message, read_json, read_json_mapping, read_yaml


def _read_yaml(path: str | Path, rebuild: str = REBUILD_CAMPAIGN) -> dict[str, Any]:
    """A YAML mapping; a damaged file is a DamagedFileError naming it and ``rebuild``."""
    try:
        data = read_yaml(path, rebuild)
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}") from None
    if data is None:
        raise DamagedFileError(damaged_message(path, "empty", rebuild))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping")
    return data


def load_templates(config: CampaignConfig) -> dict[str, dict[str, Any]]:
    """Size -> template, reading each size's tuning result where campaign.tuning names one."""
    templates = {}
    for size in config.sizes:
        source = config.tuning.get(size)
        tuning = _read_yaml(source, REBUILD_TUNING) if source else None
        templates[size] = build_template(config, size, tuning, source or "")
    return templates


def cache_identity_of(template: Mapping[str, Any]) -> str:
    """Identity of the token cache a template trains on: RunStateError if it is not prepared yet, or if its
    validation split is incomplete while the recipe does not ask for a truncated one (the precondition of
    ranking by full validation loss)."""
    manifest = Path(template["data"]["cache_dir"]) / "manifest.json"
    if not manifest.is_file():
        raise RunStateError(f"token cache not prepared: {manifest} is missing; prepare it first")
    content = read_json(manifest)
    identity = content.get("identity")
    if not isinstance(identity, str):
        raise RunStateError(f"{manifest}: no identity field; prepare the cache again")
    truncated_on_purpose = template["data"].get("prepare_validation_tokens") is not None
    if content.get("validation_complete") is False and not truncated_on_purpose:
        raise RunStateError(
            f"{manifest}: the cache holds only part of the validation split and a campaign ranks by the full "
            "validation loss; prepare a complete cache in a new data.cache_dir (or set "
            "data.prepare_validation_tokens to rank on the truncated split on purpose)"
        )
    return identity


@dataclass(frozen=True)
class PlannedCampaign:
    """Everything the plan step writes."""

    templates: dict[str, dict[str, Any]]
    payload: dict[str, Any]
    stage1: dict[str, dict[str, Any]]
    estimate: dict[str, Any]


def estimate_only(config: CampaignConfig) -> dict[str, Any]:
    """The GPU-hour estimate before anything exists (no cache needed; tuning results used where present)."""
    templates = {}
    for size in config.sizes:
        source = config.tuning.get(size)
        tuning = _read_yaml(source, REBUILD_TUNING) if source and Path(source).is_file() else None
        templates[size] = build_template(config, size, tuning, source or "")
    return gpu_hour_estimate(config, templates, planned_throughput(config))


def make_plan(config: CampaignConfig) -> PlannedCampaign:
    templates = load_templates(config)
    caches = {size: cache_identity_of(t) for size, t in templates.items()}
    payload = campaign_identity_payload(config, templates, caches)
    estimate = gpu_hour_estimate(config, templates, planned_throughput(config))
    return PlannedCampaign(
        templates, payload, stage1_recipes(config, templates[config.stages[0].size]), estimate
    )


def precheck(config: CampaignConfig) -> None:
    """Reject changed settings before a workflow touches anything (a no-op while inputs are missing)."""
    if not (Path(config.root) / IDENTITY_FILE).is_file():
        return
    try:
        templates = load_templates(config)
        caches = {size: cache_identity_of(t) for size, t in templates.items()}
    except (ConfigError, RunStateError, DamagedFileError):
        return  # the plan step reports these with their own message once its inputs exist
    check_unchanged(config.root, campaign_identity_payload(config, templates, caches))


def campaign_record(config: CampaignConfig, plan: PlannedCampaign) -> dict[str, Any]:
    """campaign.json: identity, settings, templates, every run id and the GPU-hour estimate."""
    return {
        "identity": campaign_identity(plan.payload),
        "settings": settings_dict(config),
        "cache_identities": plan.payload["cache_identities"],
        "templates": {size: template_path(config, size) for size in plan.templates},
        "stages": [
            {
                "stage": stage,
                "size": runs[0].size,
                "runs": [r.run_id for r in runs],
                "seeds": list(stage_seeds(config.stages, i)),
                "configurations": configuration_runs(config, stage),
                "parents": config.stages[i].parents or None,
            }
            for i, (stage, runs) in enumerate(planned_runs(config).items())
        ],
        "gpu_hour_estimate": plan.estimate,
    }


def _stage_outcomes(config: CampaignConfig, index: int) -> tuple[list[RunOutcome], dict[str, dict]]:
    stage = stage_name(index)
    outcomes, recipes = [], {}
    for run in planned_runs(config)[stage]:
        result_file = Path(run_dir(config, stage, run.run_id)) / "result.json"
        if not result_file.is_file():
            raise RunStateError(f"{stage} is not finished: {result_file} is missing")
        recipe = recipes[run.run_id] = _read_yaml(recipe_path(config, stage, run.run_id))
        outcomes.append(
            outcome_from(
                run.run_id,
                read_json_mapping(result_file, REBUILD_RESULT),
                recipe,
                run.configuration,
                run.seed,
            )
        )
    return outcomes, recipes


def rank_stage(config: CampaignConfig, index: int) -> list[ConfigurationOutcome]:
    """The configurations of stage ``index`` (0-based), best first by the mean loss of their seeds."""
    return rank_configurations(_stage_outcomes(config, index)[0])


def select_children(
    config: CampaignConfig, stage_index: int
) -> tuple[list[ConfigurationOutcome], dict[str, dict]]:
    """Rank the stage before ``stage_index`` (0-based) and build that stage's recipes from its files."""
    outcomes, recipes = _stage_outcomes(config, stage_index - 1)
    ranked = rank_configurations(outcomes)
    template = _read_yaml(template_path(config, config.stages[stage_index].size))
    parents = [recipes[c.runs[0].run_id] for c in ranked]
    return ranked, child_recipes(config, stage_index, template, parents)
