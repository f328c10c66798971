"""Complete recipes: a template per size, stage-1 grid recipes and children of ranked parents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tiny_llm.campaign.stages import (
    CampaignConfig,
    PlannedRun,
    optimizer_values,
    planned_runs,
    run_dir,
    stage_name,
)
from tiny_llm.config import (
    deep_merge,
    identity_differences,
    read_config_source,
    recipe_from_dict,
    recipe_to_dict,
)
from tiny_llm.errors import ConfigError, RunStateError

# The one list of tuned keys: the recipe keys the tuner varies, each with whether a campaign takes it from a
# tuning result. A campaign takes execution settings only, since numerics (CPU BF16 autocast, the attention
# path) and the batch would change its results.
TUNED_KEYS: dict[str, bool] = {
    "training.micro_batch_size": True,
    "runtime.compile": True,
    "runtime.compile_mode": True,
    "runtime.sdpa_backend": True,
    "runtime.cuda_graph": True,
    "runtime.attention_backend": False,
    "runtime.cpu_amp": False,
    "runtime.cpu_threads": True,
}


def size_base(entry: Mapping[str, Any], size: str) -> dict[str, Any]:
    """A size entry ``{preset: NAME, overrides: {...}}`` -> merged recipe mapping."""
    preset = entry.get("preset")
    base = read_config_source(str(preset)) if preset else {}
    return deep_merge(base, dict(entry.get("overrides") or {}))


def check_tuning_fits(tuned: Mapping[str, Any], template: Mapping[str, Any], size: str, source: str) -> None:
    """ConfigError unless a tuning recipe tuned the model of ``size`` at the batch its campaign runs train
    with, since the fastest microbatch and compile mode at one batch say little about another. The workflow
    checks each tuning profile before anything runs, and the campaign's plan step each tuning result."""
    if tuned["model"] != template["model"]:
        diffs = identity_differences(template["model"], tuned["model"])
        raise ConfigError(
            f"campaign.tuning.{size}: {source} tuned another model shape ({'; '.join(diffs[:3])}); "
            f"tune the size's own preset or drop it from campaign.tuning"
        )
    measured, trains = tuned["training"]["batch_tokens"], template["training"]["batch_tokens"]
    if measured != trains:
        raise ConfigError(
            f"campaign.tuning.{size}: {source} was measured at training.batch_tokens={measured}, but size "
            f"'{size}' trains at {trains}; tune it at its campaign batch or drop it from campaign.tuning"
        )


def tuned_settings(
    tuning_recipe: Mapping[str, Any], template: Mapping[str, Any], size: str, source: str
) -> dict[str, dict[str, Any]]:
    """The execution settings a tuning result gives a size (ConfigError if it does not fit the size)."""
    tuned = recipe_to_dict(recipe_from_dict(dict(tuning_recipe)))
    check_tuning_fits(tuned, template, size, source)
    settings: dict[str, dict[str, Any]] = {}
    for key, taken in TUNED_KEYS.items():
        section, name = key.split(".", 1)
        if taken:
            settings.setdefault(section, {})[name] = tuned[section][name]
    return settings


def build_template(
    config: CampaignConfig, size: str, tuning_recipe: Mapping[str, Any] | None = None, source: str = ""
) -> dict[str, Any]:
    """The complete recipe every run of ``size`` starts from (before its optimizer values and run dir)."""
    data = deep_merge(size_base(config.sizes[size], size), dict(config.overrides))
    if size in config.batch_tokens:
        data = deep_merge(data, {"training": {"batch_tokens": config.batch_tokens[size]}})
    template = recipe_to_dict(_validated(data, f"campaign template for size '{size}'"))
    if tuning_recipe is not None:
        for section, values in tuned_settings(tuning_recipe, template, size, source).items():
            template[section].update(values)
        template = recipe_to_dict(_validated(template, f"size '{size}' with the tuning result {source}"))
    template["runtime"]["output_dir"] = f"{config.root}/templates/{size}"
    return template


def _validated(data: dict[str, Any], what: str):
    try:
        return recipe_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _run_recipe(template: Mapping[str, Any], optimizer: Mapping[str, Any], run: PlannedRun, out_dir: str):
    """The template with the run's optimizer values, its seed (where the stage has seeds) and run dir."""
    runtime: dict[str, Any] = {"output_dir": out_dir}
    if run.seed is not None:
        runtime["seed"] = run.seed
    recipe = deep_merge(dict(template), {"optimizer": dict(optimizer), "runtime": runtime})
    return recipe_to_dict(_validated(recipe, f"campaign run {out_dir}"))


def stage1_recipes(config: CampaignConfig, template: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Run id -> complete recipe for every grid point and seed of stage 1."""
    runs = planned_runs(config)[stage_name(0)]
    return {
        r.run_id: _run_recipe(template, optimizer_values(r.optimizer), r, run_dir(config, r.stage, r.run_id))
        for r in runs
    }


def child_recipes(
    config: CampaignConfig,
    stage_index: int,
    template: Mapping[str, Any],
    parents: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Run id -> recipe for a later stage: each parent's whole optimizer block, then the stage's values,
    once per seed of the stage.

    ``parents`` are recipes of the previous stage's configurations in rank order (0 = best), one per
    configuration (its seeds differ only in runtime.seed).
    """
    runs = planned_runs(config)[stage_name(stage_index)]
    needed = config.stages[stage_index].parents
    if len(parents) < needed:
        raise RunStateError(f"{stage_name(stage_index)} needs {needed} parents, got {len(parents)}")
    out = {}
    for run in runs:
        if run.parent_rank is None:
            raise RunStateError(f"{run.run_id}: a stage-{stage_index + 1} run has no parent rank")
        optimizer = deep_merge(dict(parents[run.parent_rank]["optimizer"]), optimizer_values(run.optimizer))
        out[run.run_id] = _run_recipe(template, optimizer, run, run_dir(config, run.stage, run.run_id))
    return out
