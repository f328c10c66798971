"""A recipe's identity decides whether a finished run is kept, resumed or set aside: the identities of shipped
presets and of the shipped workflow configs' AdamW runs are pinned here (the values computed before the
optimizer's Muon keys became a section of their own), so that a change of the recipe's shape that moves one
fails here first."""

from __future__ import annotations

import pytest
from pipeline_helpers import plan_of, shipped

from tiny_llm import campaign
from tiny_llm.config import load_recipe, recipe_from_dict, recipe_identity, recipe_to_dict
from tiny_llm.errors import ConfigError

PRESETS = {
    "tiny": "1b7958f313d8958af35d2ae9f95c58e577c4070cae025a31e3893528a1ab70ee",
    "demo-s": "a69ddba2582e427ac046d98a04a6bd194299dfb47546e321a5f43897cb92ba47",
    "20m": "2fb44eb060fe6777c02802a38a2534a3d84e6fc2ed05ccd88771f82109ad768c",
    "packed4-20m-awc": "b3c3062b10b4902636147a9666706e3e4d7d78fd82977edcb8e125b159b69af6",
}
CLUSTER_RUN = "1b9f708e63d89223c458cd17bd5c34eb95d5f6af403d198a03d84bd0fd63fbf8"
CAMPAIGN_RUNS = {  # stage 1 of a shipped campaign, its template as planned before any tuning result
    ("config/cluster.yaml", "20m-lr0.0003-wd0.1"): CLUSTER_RUN,
    ("config/optimizers-20m.yaml", "20m-lr0.0056-s42"): PRESETS["20m"],
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_shipped_preset_keeps_its_identity(preset: str) -> None:
    assert recipe_identity(load_recipe([preset]), "c") == PRESETS[preset]


def test_the_demos_adamw_run_keeps_its_identity() -> None:
    plan = plan_of(shipped("workflow_config.yaml"))
    recipe = recipe_from_dict(plan.files.content("results/runs/demo-s/recipe.yaml"))
    assert recipe_identity(recipe, "c") == "91d18d31b111685804565ae1c0f339548708465f3949f44aac99a90d14515377"


@pytest.mark.parametrize(("config", "run"), sorted(CAMPAIGN_RUNS))
def test_a_campaign_adamw_run_keeps_its_identity(config: str, run: str) -> None:
    settings = plan_of(shipped(config)).campaign.config
    assert settings is not None
    template = campaign.build_template(settings, settings.stages[0].size)
    recipe = recipe_from_dict(campaign.stage1_recipes(settings, template)[run])
    assert recipe_identity(recipe, "c") == CAMPAIGN_RUNS[(config, run)]


def test_a_recipe_file_written_before_the_muon_section_is_read_as_it_was() -> None:
    """Every recipe file written before held the six muon_* keys as null (an AdamW run's): they are read as
    absent; one that is set is refused in one line naming its place now."""
    data = recipe_to_dict(load_recipe(["20m"]))
    assert data["optimizer"].pop("muon") is None
    earlier = {"lr", "momentum", "nesterov", "ns_steps", "weight_decay", "adjust_lr_fn"}
    data["optimizer"].update({f"muon_{key}": None for key in earlier})
    assert recipe_identity(recipe_from_dict(data), "c") == PRESETS["20m"]
    data["optimizer"].update(name="muon", muon_lr=0.02)
    with pytest.raises(ConfigError) as err:
        recipe_from_dict(data)
    assert str(err.value) == (
        "invalid recipe: optimizer.muon_lr: is optimizer.muon.lr now (a section of its own); move it there"
    )
