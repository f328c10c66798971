# Recipe campaign (SPEC §6): stage 1 trains a grid on the smallest size, each later stage trains the best
# `parents` runs of the stage before on the next size with the parent's whole optimizer block copied. Children are
# named by their parent's rank (50m-parent0-beta2-0.99), so every file is known when the workflow is parsed: a
# select_stageN rule ranks stage N-1 and writes stage N's recipes as ordinary outputs.
#
# <campaign>/campaign.json       identity, settings, run ids, GPU-hour estimate (plan_campaign)
# <campaign>/identity.json       the identity first planned here (never a declared output: it outlives reruns)
# <campaign>/templates/<size>.yaml, recipes/<stage>/<run>.yaml   complete recipes
# <campaign>/<stage>/<run>/      run directories (result.json declared; resumable state beside it)
# <campaign>/<stage>/ranking.json, report/   rankings and the comparison report
#
# Recipes are `ancient` inputs of training: rewriting one with the same content (a replanned campaign) never
# retrains a finished run, and a change of content is rejected by the campaign identity before anything runs.

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
    tuning = {size: f"results/{profile}-tuning/selected.yaml" for size, profile in section["tuning"].items()}
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


if CAMPAIGN:

    rule plan_campaign:
        input:
            unpack(campaign_plan_inputs),
        output:
            plan=report(
                f"{CAMPAIGN_ROOT}/campaign.json",
                caption="../report/campaign-plan.rst",
                category="Recipe campaign",
            ),
            templates=[campaign_lib.template_path(CAMPAIGN, size) for size in CAMPAIGN.sizes],
            recipes=campaign_recipes("stage1"),
        params:
            settings=CAMPAIGN_SETTINGS,
        log:
            "logs/plan_campaign/campaign.log",
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            # tee: the GPU-hour estimate is printed before any run starts, and kept in the log
            "python -m tiny_llm campaign plan --settings {params.settings:q} 2>&1 | tee {log}"

    rule train_campaign:
        input:
            unpack(campaign_train_inputs),
        output:
            f"{CAMPAIGN_ROOT}/{{stage}}/{{run}}/result.json",
        params:
            numerics=NUMERICS_VERSION,
            threads=campaign_thread_flags,
        log:
            "logs/train_campaign/{stage}/{run}.log",
        threads: size_threads(campaign_size)
        resources:
            **size_resources(campaign_size),
        wildcard_constraints:
            stage=r"stage\d+",
        conda:
            "../envs/torch.yaml"
        shell:
            "python -m tiny_llm train --config {input.recipe} {params.threads} --resume auto > {log} 2>&1"

    for _index in range(1, len(CAMPAIGN.stages)):
        _previous, _stage = campaign_lib.stage_name(_index - 1), campaign_lib.stage_name(_index)

        rule:
            name:
                f"select_{_stage}"
            input:
                results=campaign_results(_previous),
                recipes=[ancient(path) for path in campaign_recipes(_previous)],
                template=ancient(campaign_lib.template_path(CAMPAIGN, CAMPAIGN.stages[_index].size)),
            output:
                ranking=campaign_lib.ranking_path(CAMPAIGN, _previous),
                recipes=campaign_recipes(_stage),
            params:
                settings=CAMPAIGN_SETTINGS,
                stage=_index + 1,
            log:
                f"logs/select_stage/{_stage}.log",
            localrule: True
            conda:
                "../envs/report.yaml"
            shell:
                "python -m tiny_llm campaign select --settings {params.settings:q} --stage {params.stage} "
                "> {log} 2>&1"

    rule rank_final_stage:
        input:
            results=campaign_results(campaign_lib.stage_name(len(CAMPAIGN.stages) - 1)),
        output:
            campaign_lib.ranking_path(CAMPAIGN, campaign_lib.stage_name(len(CAMPAIGN.stages) - 1)),
        params:
            settings=CAMPAIGN_SETTINGS,
            stage=len(CAMPAIGN.stages),
        log:
            "logs/rank_final_stage/campaign.log",
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            "python -m tiny_llm campaign rank --settings {params.settings:q} --stage {params.stage} > {log} 2>&1"

    rule report_campaign:
        input:
            results=[path for stage in CAMPAIGN_RUNS for path in campaign_results(stage)],
            rankings=campaign_rankings(),
        output:
            [
                report(path, caption="../report/campaign-selected.rst", category="Recipe campaign")
                for path in campaign_selected()
            ],
            table=report(
                f"{CAMPAIGN_ROOT}/report/report.md",
                caption="../report/campaign-table.rst",
                category="Recipe campaign",
            ),
            comparison=report(
                f"{CAMPAIGN_ROOT}/report/comparison.json",
                caption="../report/campaign-comparison.rst",
                category="Recipe campaign",
            ),
            curves=report(
                f"{CAMPAIGN_ROOT}/report/learning-curves.png",
                caption="../report/campaign-curves.rst",
                category="Recipe campaign",
            ),
        params:
            runs=CAMPAIGN_ROOT,
            outdir=output_parent,
            sizes=campaign_report_flags,
        log:
            "logs/report_campaign/campaign.log",
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            "python -m tiny_llm report --runs {params.runs} --output-dir {params.outdir} {params.sizes} > {log} 2>&1"

    rule campaign:
        input:
            rules.report_campaign.output,
            campaign_rankings(),

    register_stage(
        "campaign",
        list(rules.report_campaign.output) + campaign_rankings(),
        enabled=config["campaign"]["enabled"],
    )
