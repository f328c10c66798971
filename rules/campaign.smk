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
#
# Planning, selection, ranking and the report are cheap local rules (on Slurm they run beside the controller);
# only training jobs take a GPU.


include: "campaign_common.smk"


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
            run_dir=campaign_run_dir,
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
            # a run that diverged (non-finite loss) is recorded as a result ranked last; other failures fail the job
            "python -m tiny_llm train --config {input.recipe} {params.threads} --resume auto > {log} 2>&1 "
            "|| python -m tiny_llm campaign diverged --run-dir {params.run_dir} --exit-code $? >> {log} 2>&1"

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
            runs=campaign_runs_root,
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
