# WSD horizon study (target `horizons`): per size and seed one stable trunk and one decay branch per horizon.
#
# results/horizons/seed<S>/trunk/{recipe.yaml, stopped.json}   the longest horizon's recipe trained to its decay
#                                                              start, keeping step-NNNNNNN.pt at every shorter
#                                                              horizon's decay start (stopped.json written last)
# results/horizons/seed<S>/h<H>/{recipe.yaml, result.json}     one branch per horizon from the trunk's state at its
#                                                              decay start; equal to an independent WSD run at H
# results/report/horizons/{report.md, horizons.json, loss-vs-horizon.png}   final loss against horizon
#
# With horizons.sizes each size's study is results/horizons/<size>/seed<S>/...; a recipe variant's
# (horizons.variants) results/horizons-<variant>/[<size>/]seed<S>/... (the {horizon_study} wildcard).
#
# The study needs loader v2 (data.shuffle_group_size) and says so in one line when it is missing.
# (paths: tiny_llm/pipeline/layout.py)


wildcard_constraints:
    horizon_study=r"horizons(-[A-Za-z0-9][A-Za-z0-9._-]*)?(/[A-Za-z0-9][A-Za-z0-9._-]*)?",
    horizon_seed=r"[0-9]+",
    horizon=r"h[0-9][0-9.e+-]*",


rule train_trunk:
    input:
        recipe=HORIZONS_TRUNK_RECIPE,
        cache=PLAN.data.cache_manifest,
    output:
        HORIZONS_TRUNK_STOPPED,
    log:
        "logs/train_trunk/{horizon_study}/seed{horizon_seed}.log",
    benchmark:
        "logs/train_trunk/{horizon_study}/seed{horizon_seed}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("horizons")
    resources:
        **PLAN.resources("horizons"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
        flags=horizon_trunk_flags,
        launch=PLAN.launcher("horizons"),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "{params.launch} tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} "
        "--resume auto --set-aside-changed {params.flags:q} > {log:q} 2>&1"


rule train_branch:
    input:
        recipe=HORIZONS_BRANCH_RECIPE,
        trunk=HORIZONS_TRUNK_STOPPED,
        cache=PLAN.data.cache_manifest,
    output:
        HORIZONS_BRANCH_RESULT,
    log:
        "logs/train_branch/{horizon_study}/seed{horizon_seed}-{horizon}.log",
    benchmark:
        "logs/train_branch/{horizon_study}/seed{horizon_seed}-{horizon}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("horizons")
    resources:
        **PLAN.resources("horizons"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
        state=horizon_branch_state,
        launch=PLAN.launcher("horizons"),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "{params.launch} tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} "
        "--resume auto --set-aside-changed --from-state {params.state:q} > {log:q} 2>&1"


rule report_horizons:
    input:
        PLAN.horizons.results(),
    output:
        table=HORIZONS_TABLE,
        summary=HORIZONS_SUMMARY,
        plot=report(
            HORIZONS_PLOT,
            caption="../report/horizons-loss.rst",
            category="WSD horizons",
        ),
    log:
        "logs/report_horizons/horizons.log",
    benchmark:
        "logs/report_horizons/horizons.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        runs=input_parents,
        outdir=output_parent,
    shell:
        "python -m tiny_llm horizons-report --runs {params.runs:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
