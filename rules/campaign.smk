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
# (<campaign> is campaign.output_dir; the patterns are CAMPAIGN_FILES, tiny_llm/pipeline/layout.py)
#
# Recipes and templates are plain inputs (rules/common.smk says why none is `ancient`): a replanned campaign
# rewrites them with the same content, and a finished run then only redoes its final validation; a change of
# content is rejected by the campaign identity before anything runs.
# Planning, selection, ranking and the report are cheap local rules (on Slurm they run beside the controller);
# only training jobs take a GPU. A workflow config without campaign stages leaves these rules without targets.


rule plan_campaign:
    input:
        unpack(campaign_plan_inputs),
    output:
        plan=report(
            CAMPAIGN_FILES.record,
            caption="../report/campaign-plan.rst",
            category="Recipe campaign",
        ),
        templates=PLAN.campaign.templates(),
        recipes=PLAN.campaign.recipes("stage1"),
    log:
        "logs/plan_campaign/campaign.log",
    benchmark:
        "logs/plan_campaign/campaign.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
        estimate=PLAN.campaign.estimate_text,
    message:
        "Plan the campaign in {CAMPAIGN_ROOT}; GPU-hour estimate (training only):\n{params.estimate}"
    shell:
        # tee: the GPU-hour estimate is printed before any run starts, and kept in the log
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm campaign plan --settings {input.settings:q} 2>&1 | tee {log:q}"


rule train_campaign:
    input:
        recipe=CAMPAIGN_FILES.recipe,
        cache=PLAN.data.cache_manifest,
    output:
        CAMPAIGN_FILES.result,
    log:
        "logs/train_campaign/{stage}/{run}.log",
    benchmark:
        "logs/train_campaign/{stage}/{run}.tsv"
    wildcard_constraints:
        stage=r"stage\d+",
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("campaign")
    resources:
        **PLAN.resources("campaign"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
        threads=campaign_thread_flags,
        launch=PLAN.launcher("campaign"),
    shell:
        # a run that diverged (non-finite loss) is recorded as a result ranked last; other failures fail the job
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "{params.launch} tiny_llm train --config {input.recipe:q} {params.threads:q} --resume auto --record-divergence "
        "> {log:q} 2>&1"


rule select_run:
    input:
        settings=CAMPAIGN_FILES.settings,
        results=campaign_parent_results,
        recipes=campaign_parent_recipes,
        template=campaign_template,
        ties=campaign_parent_ties,
    output:
        CAMPAIGN_FILES.recipe,
    log:
        "logs/select_run/{stage}/{run}.log",
    benchmark:
        "logs/select_run/{stage}/{run}.tsv"
    wildcard_constraints:
        stage=r"stage([2-9]|[1-9][0-9]+)",
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
        stage=campaign_stage_number,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm campaign select --settings {input.settings:q} --stage {params.stage:q} "
        "--run {wildcards.run:q} > {log:q} 2>&1"


rule rank_stage:
    input:
        settings=CAMPAIGN_FILES.settings,
        results=campaign_stage_results,
        ties=campaign_stage_ties,
    output:
        CAMPAIGN_FILES.ranking,
    log:
        "logs/rank_stage/{stage}.log",
    benchmark:
        "logs/rank_stage/{stage}.tsv"
    wildcard_constraints:
        stage=r"stage\d+",
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
        stage=campaign_stage_number,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
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
        table=CAMPAIGN_FILES.report.table,
        table_html=report(
            CAMPAIGN_FILES.report.table_html,
            caption="../report/campaign-table.rst",
            category="Recipe campaign",
        ),
        comparison=report(
            CAMPAIGN_FILES.report.comparison,
            caption="../report/campaign-comparison.rst",
            category="Recipe campaign",
        ),
        curves=report(
            CAMPAIGN_FILES.report.curves,
            caption="../report/campaign-curves.rst",
            category="Recipe campaign",
        ),
        intervals=report(
            CAMPAIGN_FILES.intervals,
            caption="../report/campaign-intervals.rst",
            category="Recipe campaign",
        ),
    log:
        "logs/report_campaign/campaign.log",
    benchmark:
        "logs/report_campaign/campaign.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        runs=campaign_root,
        outdir=output_parent,
        sizes=words(PLAN.campaign.report_flags()),
    shell:
        "python -m tiny_llm report --runs {params.runs:q} --output-dir {params.outdir:q} {params.sizes:q} > {log:q} 2>&1"


# campaign.promotion.resolve_ties: where a stage's cut is inside the seeds' noise, each round adds seeds to the
# configurations on either side of it and tests again. Which runs a round adds depends on the results, so a
# round is a checkpoint; its extra seeds (<configuration>-tie<round>-s<seed>) get their recipes from add_seed,
# an ordinary output, and train through train_campaign. rank_stage and select_run walk the decided rounds
# (pipeline/campaign.py); without the rule there are no rounds and the DAG is the reference's.


checkpoint resolve_cut:
    input:
        settings=CAMPAIGN_FILES.settings,
        results=campaign_stage_results,
        earlier=campaign_earlier_ties,
    output:
        CAMPAIGN_FILES.tie_round,
    log:
        "logs/resolve_cut/{stage}/round-{round}.log",
    benchmark:
        "logs/resolve_cut/{stage}/round-{round}.tsv"
    wildcard_constraints:
        stage=r"stage\d+",
        round=r"[1-9][0-9]*",
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
        stage=campaign_stage_number,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm campaign resolve --settings {input.settings:q} --stage {params.stage:q} "
        "--round {wildcards.round:q} > {log:q} 2>&1"


rule add_seed:
    input:
        settings=CAMPAIGN_FILES.settings,
        decision=campaign_tie_decision,
        source=campaign_tie_source,
    output:
        CAMPAIGN_FILES.recipe,
    log:
        "logs/add_seed/{stage}/{run}.log",
    benchmark:
        "logs/add_seed/{stage}/{run}.tsv"
    wildcard_constraints:
        stage=r"stage\d+",
        run=PLAN.campaign.tie_run_pattern,
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
        stage=campaign_stage_number,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm campaign add-seed --settings {input.settings:q} --stage {params.stage:q} "
        "--run {wildcards.run:q} > {log:q} 2>&1"


ruleorder: add_seed > select_run
