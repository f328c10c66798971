# Helpers of the recipe campaign's rules (rules/campaign.smk): functions only, torch-free. Parsing validates the
# campaign section and rejects a campaign directory that already holds a campaign with other settings.

from tiny_llm import campaign as campaign_lib

CAMPAIGN_ROOT = config["campaign"]["output_dir"].rstrip("/")


def campaign_settings() -> tuple[dict, dict]:
    """Settings handed to `tiny_llm campaign`: the stages plus each size's full recipe overrides."""
    section = config["campaign"]
    sizes = {}
    for stage in section["stages"]:
        name = stage["size"]
        if name in config["sizes"]:
            threads = {"runtime": {"cpu_threads": config["sizes"][name]["threads"]}}
            sizes[name] = {"preset": config["sizes"][name]["preset"], "overrides": size_overrides(name, threads)}
    tuning = {size: campaign_lib.tuning_selected_path(profile) for size, profile in section["tuning"].items()}
    raw = {**section, "tuning": tuning}
    return raw, sizes


def load_campaign() -> "campaign_lib.CampaignConfig":
    raw, sizes = campaign_settings()
    for i, stage in enumerate(raw["stages"]):
        if stage["size"] not in config["sizes"]:
            raise WorkflowError(
                f"campaign.stages[{i}].size: unknown size '{stage['size']}'; sizes: {', '.join(config['sizes'])}"
            )
    try:
        parsed = campaign_lib.parse_campaign(raw, sizes, CAMPAIGN_ROOT, NUMERICS_VERSION)
        for size in parsed.sizes:
            register_recipe(load_size_recipe(size, campaign_recipe_overrides(size), where=f"campaign ({size})"))
        campaign_lib.precheck(parsed)
    except campaign_lib.CampaignChangedError as exc:
        raise WorkflowError(str(exc)) from None
    except ConfigError as exc:
        raise WorkflowError(f"campaign: {exc}") from None
    return parsed


def campaign_recipe_overrides(size: str) -> dict:
    overrides = config["campaign"]["overrides"]
    if size in config["campaign"]["batch_tokens"]:
        overrides = deep_merge(overrides, {"training": {"batch_tokens": config["campaign"]["batch_tokens"][size]}})
    return overrides


CAMPAIGN = load_campaign() if config["campaign"]["stages"] else None
CAMPAIGN_RUNS = campaign_lib.planned_runs(CAMPAIGN) if CAMPAIGN else {}
CAMPAIGN_SIZE = {run.run_id: run.size for runs in CAMPAIGN_RUNS.values() for run in runs}
CAMPAIGN_SETTINGS = json.dumps(campaign_lib.settings_dict(CAMPAIGN)) if CAMPAIGN else "{}"


def campaign_size(wildcards) -> str:
    if wildcards.run not in CAMPAIGN_SIZE:
        raise WorkflowError(f"{wildcards.run} is not a run of the campaign in {CAMPAIGN_ROOT} (see campaign.json)")
    return CAMPAIGN_SIZE[wildcards.run]


def campaign_results(stage: str) -> list[str]:
    return [f"{CAMPAIGN_ROOT}/{stage}/{run.run_id}/result.json" for run in CAMPAIGN_RUNS[stage]]


def campaign_recipes(stage: str) -> list[str]:
    return [campaign_lib.recipe_path(CAMPAIGN, stage, run.run_id) for run in CAMPAIGN_RUNS[stage]]


def campaign_rankings() -> list[str]:
    return [campaign_lib.ranking_path(CAMPAIGN, stage) for stage in CAMPAIGN_RUNS]


def campaign_selected() -> list[str]:
    return [f"{CAMPAIGN_ROOT}/report/selected-{size}.yaml" for size in CAMPAIGN.sizes]


def campaign_plan_inputs(wildcards) -> dict[str, str]:
    return {"cache": cache_dir(), **{f"tuning_{size}": path for size, path in CAMPAIGN.tuning.items()}}


def campaign_train_inputs(wildcards) -> dict:
    return {
        "recipe": ancient(campaign_lib.recipe_path(CAMPAIGN, wildcards.stage, wildcards.run)),
        "cache": ancient(cache_dir()),
    }


def campaign_thread_flags(wildcards, threads) -> str:
    """Untuned sizes train with the job's threads; tuned ones keep the threads their tuning selected."""
    if campaign_size(wildcards) in CAMPAIGN.tuning:
        return ""
    return f"--set runtime.cpu_threads={threads}"


def campaign_report_flags(wildcards) -> str:
    return " ".join(f"--require-size {shlex.quote(size)}" for size in CAMPAIGN.sizes)


def campaign_runs_root(wildcards, output) -> str:
    """The campaign directory: two levels above the report files."""
    return str(Path(output.table).parents[1])


def campaign_run_dir(wildcards, output) -> str:
    """A training job's run directory: where its result.json goes."""
    return str(Path(output[0]).parent)
