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
from tiny_llm.campaign.significance import contested, stage_noise
from tiny_llm.campaign.stages import (
    CampaignConfig,
    configuration_runs,
    first_run_of,
    planned_runs,
    promoted_count,
    recipe_path,
    run_dir,
    settings_dict,
    stage_name,
    stage_seeds,
    template_path,
    tie_round_path,
    tie_rounds,
    tie_run_id,
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


def _stage_outcomes(
    config: CampaignConfig, index: int, rounds: int | None = None
) -> tuple[list[RunOutcome], dict[str, dict]]:
    """Every finished run of stage ``index``: its planned runs, then the extra seeds of its tie-resolving
    rounds (up to ``rounds``; None: every round decided so far)."""
    stage = stage_name(index)
    outcomes, recipes = [], {}
    members = [(run.run_id, run.configuration, run.seed) for run in planned_runs(config)[stage]]
    members += [(e["run"], e["configuration"], e["seed"]) for e in tie_extras(config, index, rounds)]
    for run_id, configuration, seed in members:
        result_file = Path(run_dir(config, stage, run_id)) / "result.json"
        if not result_file.is_file():
            raise RunStateError(f"{stage} is not finished: {result_file} is missing")
        recipe = recipes[run_id] = _read_yaml(recipe_path(config, stage, run_id))
        result = read_json_mapping(result_file, REBUILD_RESULT)
        outcomes.append(outcome_from(run_id, result, recipe, configuration, seed))
    return outcomes, recipes


def tie_decisions(config: CampaignConfig, index: int, rounds: int | None = None) -> list[dict[str, Any]]:
    """The decided tie-resolving rounds of stage ``index`` in order (up to ``rounds``), up to the first that
    added no seed (the cut held, or was never inside the noise)."""
    decisions = []
    for round_ in tie_rounds(config, index)[:rounds]:
        path = Path(tie_round_path(config, stage_name(index), round_))
        if not path.is_file():
            break
        decisions.append(read_json_mapping(path, REBUILD_CAMPAIGN))
        if not decisions[-1]["runs"]:
            break
    return decisions


def tie_extras(config: CampaignConfig, index: int, rounds: int | None = None) -> list[dict[str, Any]]:
    """The extra seeds' runs ({run, configuration, seed, source}) the decided rounds added."""
    return [entry for decision in tie_decisions(config, index, rounds) for entry in decision["runs"]]


def resolve_round(config: CampaignConfig, index: int, round_: int) -> dict[str, Any]:
    """Round ``round_``'s decision at stage ``index``'s cut (``campaign.promotion.resolve_ties``): rank with
    the seeds so far; when the cut is inside the noise, the configurations on either side of it
    (``significance.contested``) each get the rule's extra seeds, the same new seeds for all of them."""
    rule = config.resolve_ties
    if rule is None or round_ not in tie_rounds(config, index):
        rounds = tie_rounds(config, index)
        raise ConfigError(
            f"--round: stage {index + 1} has no tie-resolving round {round_} (rounds: {rounds})"
        )
    outcomes, recipes = _stage_outcomes(config, index, round_ - 1)
    ranked = rank_configurations(outcomes)
    promoted = promoted_count(config, index)
    tied = contested({c.configuration: c.losses for c in ranked}, promoted)
    noise = stage_noise({c.configuration: c.losses for c in ranked}, promoted)
    start = 1 + max(_seed_of(o, recipes[o.run_id]) for o in outcomes)
    seeds = list(range(start, start + rule.extra_seeds)) if tied else []
    stage = stage_name(index)
    runs = [
        {
            "run": tie_run_id(c, round_, seed),
            "configuration": c,
            "seed": seed,
            "source": first_run_of(config, stage, c),
        }
        for c in tied
        for seed in seeds
    ]
    cut = noise.cut.as_dict() if noise.cut else None
    return {
        "stage": stage,
        "round": round_,
        "promoted": promoted,
        "cut": cut,
        "contested": tied,
        "runs": runs,
    }


def _seed_of(outcome: RunOutcome, recipe: Mapping[str, Any]) -> int:
    """A run's seed: its planned one, else its recipe's runtime.seed (a stage without seeds)."""
    if outcome.seed is not None:
        return outcome.seed
    return int((recipe.get("runtime") or {}).get("seed") or 0)


def tie_recipe(config: CampaignConfig, index: int, run_id: str) -> dict[str, Any]:
    """An extra seed's recipe: its configuration's first run's, with the new seed and its own directory."""
    stage = stage_name(index)
    entry = next((e for e in tie_extras(config, index) if e["run"] == run_id), None)
    if entry is None:
        raise RunStateError(
            f"{run_id} is no extra seed that a decided tie-resolving round of {stage} added (see "
            f"{config.root}/{stage}/ties/)"
        )
    recipe = _read_yaml(recipe_path(config, stage, entry["source"]))
    runtime = {
        **recipe.get("runtime", {}),
        "seed": entry["seed"],
        "output_dir": run_dir(config, stage, run_id),
    }
    return {**recipe, "runtime": runtime}


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
