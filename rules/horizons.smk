# WSD horizon study (target `horizons`): per seed one stable trunk and one decay branch per horizon.
#
# results/horizons/seed<S>/trunk/{recipe.yaml, stopped.json}   the longest horizon's recipe trained to its decay
#                                                              start, keeping step-NNNNNNN.pt at every shorter
#                                                              horizon's decay start (stopped.json written last)
# results/horizons/seed<S>/h<H>/{recipe.yaml, result.json}     one branch per horizon from the trunk's state at its
#                                                              decay start; equal to an independent WSD run at H
# results/report/horizons/{report.md, horizons.json, loss-vs-horizon.png}   final loss against horizon
#
# The study needs loader v2 (data.shuffle_group_size) and says so in one line when it is missing.
# Its input and params functions are in rules/common.smk.


wildcard_constraints:
    hseed=r"[0-9]+",
    horizon=r"h[0-9][0-9.e+-]*",


rule train_trunk:
    input:
        recipe=ancient(f"{HORIZONS_DIR}/seed{{hseed}}/trunk/recipe.yaml"),
        cache=PLAN.cache_dir,
    output:
        f"{HORIZONS_DIR}/seed{{hseed}}/trunk/stopped.json",
    params:
        plan_files=plan_file_digest,
        numerics=NUMERICS_VERSION,
        flags=PLAN.horizons.trunk_flags() if PLAN.horizons.horizons else "",
    log:
        "logs/train_trunk/seed{hseed}.log",
    threads: PLAN.threads("horizons")
    resources:
        **PLAN.resources("horizons"),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm train --config {input.recipe} --set runtime.cpu_threads={threads} --resume auto "
        "{params.flags} > {log} 2>&1"


rule train_branch:
    input:
        recipe=ancient(f"{HORIZONS_DIR}/seed{{hseed}}/{{horizon}}/recipe.yaml"),
        trunk=horizon_trunk_done,
        cache=PLAN.cache_dir,
    output:
        f"{HORIZONS_DIR}/seed{{hseed}}/{{horizon}}/result.json",
    params:
        plan_files=plan_file_digest,
        numerics=NUMERICS_VERSION,
        state=horizon_branch_state,
    log:
        "logs/train_branch/seed{hseed}-{horizon}.log",
    threads: PLAN.threads("horizons")
    resources:
        **PLAN.resources("horizons"),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm train --config {input.recipe} --set runtime.cpu_threads={threads} --resume auto "
        "--from-state {params.state} > {log} 2>&1"


rule report_horizons:
    input:
        PLAN.horizons.results(),
    output:
        table=f"{HORIZONS_REPORT_DIR}/report.md",
        summary=f"{HORIZONS_REPORT_DIR}/horizons.json",
        plot=report(
            f"{HORIZONS_REPORT_DIR}/loss-vs-horizon.png",
            caption="../report/horizons-loss.rst",
            category="WSD horizons",
        ),
    params:
        runs=horizon_branch_dirs,
        outdir=output_parent,
    log:
        "logs/report_horizons/horizons.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm horizons-report --runs {params.runs} --output-dir {params.outdir} > {log} 2>&1"
