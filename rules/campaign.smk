# Recipe campaign (SPEC §6): stage 1 trains a grid on the smallest size, each later stage trains the best
# `parents` runs of the stage before on the next size with the parent's whole optimizer block copied. Children are
# named by their parent's rank (50m-parent0-beta2-0.99), so every file is known when the workflow is parsed: a
# select_run job ranks the stage before and writes one child's recipe as an ordinary output.
#
# <campaign>/settings.json      what `tiny_llm campaign` is told (written by write_plan_file)
# <campaign>/campaign.json      identity, settings, run ids, GPU-hour estimate (plan_campaign)
# <campaign>/identity.json      the identity first planned here (never a declared output: it outlives reruns)
# <campaign>/templates/<size>.yaml                 complete recipe every run of a size starts from
# <campaign>/<stage>/<run>/{recipe.yaml, result.json}  run directories (resumable state beside result.json)
# <campaign>/<stage>/ranking.json, report/         rankings and the comparison report
#
# Recipes are `ancient` inputs of training: rewriting one with the same content (a replanned campaign) never
# retrains a finished run, and a change of content is rejected by the campaign identity before anything runs.
# Planning, selection, ranking and the report are cheap local rules (on Slurm they run beside the controller);
# only training jobs take a GPU.


if PLAN.campaign:
    CAMPAIGN_ROOT = PLAN.campaign.root

    rule plan_campaign:
        input:
            unpack(campaign_plan_inputs),
        output:
            plan=report(
                f"{CAMPAIGN_ROOT}/campaign.json",
                caption="../report/campaign-plan.rst",
                category="Recipe campaign",
            ),
            templates=PLAN.campaign.templates(),
            recipes=PLAN.campaign.recipes("stage1"),
        params:
            estimate=PLAN.campaign.estimate_text,
        log:
            "logs/plan_campaign/campaign.log",
        message:
            "Plan the campaign in {CAMPAIGN_ROOT}; GPU-hour estimate (training only):\n{params.estimate}"
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            # tee: the GPU-hour estimate is printed before any run starts, and kept in the log
            "python -m tiny_llm campaign plan --settings {input.settings:q} 2>&1 | tee {log:q}"

    rule train_campaign:
        input:
            recipe=ancient(f"{CAMPAIGN_ROOT}/{{stage}}/{{run}}/recipe.yaml"),
            cache=ancient(PLAN.cache_manifest),
        output:
            f"{CAMPAIGN_ROOT}/{{stage}}/{{run}}/result.json",
        params:
            numerics=NUMERICS_VERSION,
            threads=campaign_thread_flags,
        log:
            "logs/train_campaign/{stage}/{run}.log",
        threads: PLAN.threads("campaign")
        resources:
            **PLAN.resources("campaign"),
        wildcard_constraints:
            stage=r"stage\d+",
        conda:
            "../envs/torch.yaml"
        shell:
            # a run that diverged (non-finite loss) is recorded as a result ranked last; other failures fail the job
            "python -m tiny_llm train --config {input.recipe:q} {params.threads:q} --resume auto --record-divergence "
            "> {log:q} 2>&1"

    rule select_run:
        input:
            settings=ancient(PLAN.campaign.settings_file),
            results=campaign_parent_results,
            recipes=campaign_parent_recipes,
            template=campaign_template,
        output:
            f"{CAMPAIGN_ROOT}/{{stage}}/{{run}}/recipe.yaml",
        params:
            stage=campaign_stage_number,
        log:
            "logs/select_run/{stage}/{run}.log",
        wildcard_constraints:
            stage=r"stage([2-9]|[1-9][0-9]+)",
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            "python -m tiny_llm campaign select --settings {input.settings:q} --stage {params.stage:q} "
            "--run {wildcards.run:q} > {log:q} 2>&1"

    rule rank_stage:
        input:
            settings=ancient(PLAN.campaign.settings_file),
            results=campaign_stage_results,
        output:
            f"{CAMPAIGN_ROOT}/{{stage}}/ranking.json",
        params:
            stage=campaign_stage_number,
        log:
            "logs/rank_stage/{stage}.log",
        wildcard_constraints:
            stage=r"stage\d+",
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            "python -m tiny_llm campaign rank --settings {input.settings:q} --stage {params.stage:q} > {log:q} 2>&1"

    rule report_campaign:
        input:
            results=PLAN.campaign.all_results(),
            rankings=PLAN.campaign.rankings(),
        output:
            [
                report(path, caption="../report/campaign-selected.rst", category="Recipe campaign")
                for path in PLAN.campaign.selected()
            ],
            table=f"{CAMPAIGN_ROOT}/report/report.md",
            table_html=report(
                f"{CAMPAIGN_ROOT}/report/table.html",
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
            runs=campaign_root,
            outdir=output_parent,
            sizes=words(PLAN.campaign.report_flags()),
        log:
            "logs/report_campaign/campaign.log",
        localrule: True
        conda:
            "../envs/report.yaml"
        shell:
            "python -m tiny_llm report --runs {params.runs:q} --output-dir {params.outdir:q} {params.sizes:q} > {log:q} 2>&1"
