"""The staged recipe campaign as pure, torch-free functions.

Stage 1 trains a grid of optimizer settings on the smallest size; every later
stage trains the best ``parents`` runs of the stage before on the next size,
each child copying its parent's whole optimizer block (optionally crossed with
a list of beta2 values). Because children are named by their parent's *rank*
(``50m-parent0-beta2-0.99``), every run id is known before anything trains, so
the workflow's DAG is static; a selection step only fills in the recipes.

A campaign directory holds one campaign: its identity (the settings, the
per-size template recipes and the token cache identity) is recorded once in
``identity.json``, and any later plan with a different identity is rejected
instead of mixing results. Paths below the campaign directory are the
campaign's own; where the directory and the tuning results live is the
caller's choice.

Modules: ``stages`` (settings, run ids, paths), ``templates`` (recipes),
``ranking``, ``significance`` (how sure a ranking and its promotion cut are),
``identity``, ``estimate`` (GPU hours) and ``steps`` (plan, rank, select and
the tie-resolving rounds on the campaign's files).
"""

from tiny_llm.campaign.estimate import (
    describe_estimate,
    gpu_hour_estimate,
    tuned_throughput,
)
from tiny_llm.campaign.identity import (
    IDENTITY_FILE,
    CampaignChangedError,
    check_unchanged,
    identity_record,
)
from tiny_llm.campaign.ranking import (
    ConfigurationOutcome,
    RunOutcome,
    diverged_result,
    final_loss,
    loss_summary,
    rank_configurations,
    rank_runs,
    ranking_rows,
)
from tiny_llm.campaign.stages import (
    TIE_RUN,
    CampaignConfig,
    config_from_settings,
    configuration_runs,
    first_run_of,
    parse_campaign,
    parse_tie_run,
    planned_runs,
    promoted_count,
    ranking_path,
    recipe_path,
    run_dir,
    settings_dict,
    stage_name,
    template_path,
    tie_round_path,
    tie_rounds,
)
from tiny_llm.campaign.steps import (
    PlannedCampaign,
    cache_identity_of,
    campaign_record,
    estimate_only,
    load_templates,
    make_plan,
    precheck,
    rank_stage,
    resolve_round,
    select_children,
    tie_decisions,
    tie_extras,
    tie_recipe,
)
from tiny_llm.campaign.templates import (
    TUNED_KEYS,
    build_template,
    check_tuning_fits,
    child_recipes,
    size_base,
    stage1_recipes,
    tuned_settings,
)

__all__ = [
    "IDENTITY_FILE",
    "TIE_RUN",
    "TUNED_KEYS",
    "CampaignChangedError",
    "CampaignConfig",
    "ConfigurationOutcome",
    "PlannedCampaign",
    "PlannedConfiguration",
    "PlannedRun",
    "RunOutcome",
    "build_template",
    "check_tuning_fits",
    "cache_identity_of",
    "campaign_identity",
    "campaign_identity_payload",
    "campaign_record",
    "check_unchanged",
    "child_recipes",
    "config_from_settings",
    "configuration_runs",
    "describe_estimate",
    "diverged_result",
    "estimate_only",
    "final_loss",
    "first_run_of",
    "gpu_hour_estimate",
    "identity_record",
    "load_templates",
    "loss_summary",
    "make_plan",
    "parse_campaign",
    "parse_tie_run",
    "planned_runs",
    "precheck",
    "promoted_count",
    "rank_configurations",
    "rank_runs",
    "rank_stage",
    "ranking_path",
    "ranking_rows",
    "recipe_path",
    "resolve_round",
    "run_dir",
    "select_children",
    "settings_dict",
    "size_base",
    "stage1_recipes",
    "stage_name",
    "tie_decisions",
    "tie_extras",
    "tie_recipe",
    "tie_round_path",
    "tie_rounds",
    "template_path",
    "tuned_settings",
    "tuned_throughput",
]
