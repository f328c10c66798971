"""`campaign plan|select|rank`: the steps of the staged recipe campaign (what the workflow's rules call).

- ``plan``: validate the settings, build each size's template recipe, check (or record) the campaign
  identity, write campaign.json (with the GPU-hour estimate) and the stage-1 recipes.
- ``select --stage N``: rank stage N-1's configurations by the mean final validation loss of their seeds and
  write stage N's recipes (``--run ID``: only that run's recipe, as the workflow does, one job per run).
- ``rank --stage N``: write stage N's ranking (the last stage has no next one to select for).
- ``estimate``: print the GPU-hour estimate as JSON without a token cache (plan it before preparing C4).
- ``resolve --stage N --round R``: with ``campaign.promotion.resolve_ties``, decide round R at stage N's cut:
  which configurations get which extra seeds (none when the cut holds); ``<stage>/ties/round-R.json``.
- ``add-seed --stage N --run ID``: write the recipe of an extra seed that a decided round added.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tiny_llm import campaign
from tiny_llm.config import read_config_source
from tiny_llm.errors import ConfigError
from tiny_llm.io import atomic_write_json, parse_json
from tiny_llm.recorded import write_recorded_yaml


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("plan", "select", "rank", "estimate", "resolve", "add-seed"))
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--settings",
        metavar="JSON",
        help="campaign settings as JSON text or a .json file (root, stages, sizes, overrides, ...)",
    )
    source.add_argument(
        "--workflow-config",
        metavar="YAML",
        help="read the campaign from a workflow config (estimate only), e.g. config/cluster.yaml",
    )
    parser.add_argument("--stage", type=int, help="1-based stage number (select: the stage to create)")
    parser.add_argument(
        "--run", help="select: write only this run's recipe (default: the whole stage); add-seed: the run"
    )
    parser.add_argument("--round", type=int, help="resolve: the tie-resolving round (1-based)")


def _settings(text: str) -> dict[str, Any]:
    source = text
    if text.endswith(".json") and Path(text).is_file():
        source = Path(text).read_text(encoding="utf-8")
    try:
        data = parse_json(source)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--settings: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, dict) or not {"root", "stages", "sizes"} <= set(data):
        raise ConfigError("--settings: expected a JSON object with root, stages and sizes")
    return data


def plan(config: campaign.CampaignConfig) -> None:
    result = campaign.make_plan(config)
    root = Path(config.root)
    if not campaign.check_unchanged(root, result.payload):
        atomic_write_json(root / campaign.IDENTITY_FILE, campaign.identity_record(result.payload))
    for size, template in result.templates.items():
        write_recorded_yaml(campaign.template_path(config, size), template, "campaign plan")
    first = campaign.stage_name(0)
    for run_id, recipe in result.stage1.items():
        write_recorded_yaml(campaign.recipe_path(config, first, run_id), recipe, "campaign plan")
    atomic_write_json(root / "campaign.json", campaign.campaign_record(config, result))
    print(campaign.describe_estimate(result.estimate))


def _stage_index(config: campaign.CampaignConfig, stage: int | None, first: int) -> int:
    if stage is None or not first <= stage <= len(config.stages):
        raise ConfigError(f"--stage: expected a stage number in {first}..{len(config.stages)}, got {stage}")
    return stage - 1


def select(config: campaign.CampaignConfig, stage: int | None, run: str | None) -> None:
    index = _stage_index(config, stage, 2)
    ranked, recipes = campaign.select_children(config, index)
    previous = campaign.stage_name(index - 1)
    if run is not None:
        if run not in recipes:
            raise ConfigError(f"--run: '{run}' is not a run of stage {stage}: {', '.join(recipes)}")
        path = campaign.recipe_path(config, campaign.stage_name(index), run)
        write_recorded_yaml(path, recipes[run], "campaign select")
        planned = {r.run_id: r for r in campaign.planned_runs(config)[campaign.stage_name(index)]}
        print(f"{run}: parent {ranked[planned[run].parent_rank or 0].configuration} of {previous}")
        return
    rows = campaign.ranking_rows(ranked, campaign.promoted_count(config, index - 1))
    atomic_write_json(campaign.ranking_path(config, previous), rows)
    for run_id, recipe in recipes.items():
        write_recorded_yaml(
            campaign.recipe_path(config, campaign.stage_name(index), run_id), recipe, "campaign select"
        )
    promoted = ", ".join(c.configuration for c in ranked[: config.stages[index].parents])
    print(f"{previous} best: {describe_best(ranked[0])}; promoted: {promoted}{describe_cut(rows)}")


def describe_cut(rows: list[dict[str, Any]]) -> str:
    """``; the cut is inside the noise (a vs b: -0.0030, 95% [-0.05, 0.04])`` for a cut that does not hold."""
    cut = next((row["cut"] for row in rows if "cut" in row), None)
    if cut is None or not cut["inside_noise"]:
        return ""
    interval = "untested" if cut["low"] is None else f"95% [{cut['low']:+.4f}, {cut['high']:+.4f}]"
    difference = "?" if cut["difference"] is None else f"{cut['difference']:+.4f}"
    pair = f"{cut['last_promoted']} vs {cut['first_left_behind']}"
    return f"; the cut is inside the noise ({pair}: {difference}, {interval})"


def describe_best(best: campaign.ConfigurationOutcome) -> str:
    """``20m-lr0.001-wd0.1 (loss 3.609748)``, or ``... (mean loss 3.558689 +- 0.004887 over 3 seeds)``."""
    if best.diverged:
        return (
            f"{best.configuration} (no finite loss: {len(best.diverged)} of {len(best.runs)} runs diverged)"
        )
    if len(best.runs) == 1:
        return f"{best.configuration} (loss {best.mean:.6f})"
    sd = f" +- {best.sd:.6f}" if best.sd is not None else ""
    return f"{best.configuration} (mean loss {best.mean:.6f}{sd} over {len(best.runs)} seeds)"


def rank(config: campaign.CampaignConfig, stage: int | None) -> None:
    index = _stage_index(config, stage, 1)
    ranked = campaign.rank_stage(config, index)
    rows = campaign.ranking_rows(ranked, campaign.promoted_count(config, index))
    atomic_write_json(campaign.ranking_path(config, campaign.stage_name(index)), rows)
    print(f"{campaign.stage_name(index)} best: {describe_best(ranked[0])}{describe_cut(rows)}")


def resolve(config: campaign.CampaignConfig, stage: int | None, round_: int | None) -> None:
    index = _stage_index(config, stage, 1)
    if round_ is None:
        raise ConfigError("resolve: --round is required")
    decision = campaign.resolve_round(config, index, round_)
    atomic_write_json(campaign.tie_round_path(config, campaign.stage_name(index), round_), decision)
    if decision["runs"]:
        seeds = sorted({entry["seed"] for entry in decision["runs"]})
        tied = ", ".join(decision["contested"])
        print(f"round {round_}: the cut is inside the noise; seeds {seeds} for {tied}")
    else:
        print(f"round {round_}: the cut holds; nothing to add")


def add_seed(config: campaign.CampaignConfig, stage: int | None, run: str | None) -> None:
    index = _stage_index(config, stage, 1)
    if run is None:
        raise ConfigError("add-seed: --run is required")
    recipe = campaign.tie_recipe(config, index, run)
    write_recorded_yaml(
        campaign.recipe_path(config, campaign.stage_name(index), run), recipe, "campaign add-seed"
    )
    print(f"{run}: seed {recipe['runtime']['seed']}")


def _config(args: argparse.Namespace) -> campaign.CampaignConfig:
    if args.settings is not None:
        return campaign.config_from_settings(_settings(args.settings))
    if args.workflow_config is None:
        raise ConfigError(f"{args.action}: --settings (or, for estimate, --workflow-config) is required")
    if args.action != "estimate":
        raise ConfigError(
            "--workflow-config: only for 'estimate'; the workflow passes --settings to the others"
        )
    return campaign.config_from_settings(workflow_campaign_settings(args.workflow_config))


def workflow_campaign_settings(config_file: str) -> dict[str, Any]:
    """The campaign a workflow config defines, validated against the workflow's schema."""
    from tiny_llm.pipeline.plan import campaign_settings_from_config
    from tiny_llm.pipeline.schema import find_schema, load_schema

    schema = load_schema(find_schema(Path(config_file)))
    return campaign_settings_from_config(read_config_source(config_file), schema)


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.action == "plan":
        plan(config)
    elif args.action == "estimate":
        estimate = campaign.estimate_only(config)
        print(campaign.describe_estimate(estimate), file=sys.stderr)
        print(json.dumps(estimate, indent=2))
    elif args.action == "select":
        select(config, args.stage, args.run)
    elif args.action == "resolve":
        resolve(config, args.stage, args.round)
    elif args.action == "add-seed":
        add_seed(config, args.stage, args.run)
    else:
        rank(config, args.stage)
    return 0
