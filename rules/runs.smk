# Plain training runs and their report: results/runs/<run>/{recipe.yaml, result.json, evaluation.json} and
# results/report/runs/{report.md, comparison.json, learning-curves.png}.
# The trainer keeps its resumable state (latest.pt, metrics, best.json) beside result.json in the run
# directory; only result.json is declared, so Snakemake never deletes that state and `--resume auto` picks it
# up on a rerun.


rule train_run:
    input:
        recipe=f"{RUNS_DIR}/{{run}}/recipe.yaml",
        cache=ancient(PLAN.cache_manifest),
    output:
        f"{RUNS_DIR}/{{run}}/result.json",
    params:
        numerics=NUMERICS_VERSION,
    log:
        "logs/train_run/{run}.log",
    threads: PLAN.threads("runs")
    resources:
        **PLAN.resources("runs"),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} --resume auto "
        "--set-aside-changed > {log:q} 2>&1"


rule evaluate_run:
    input:
        result=f"{RUNS_DIR}/{{run}}/result.json",
    output:
        f"{RUNS_DIR}/{{run}}/evaluation.json",
    params:
        run_dir=output_parent,
        full=run_evaluate_flags,
    log:
        "logs/evaluate_run/{run}.log",
    threads: PLAN.threads("runs")
    resources:
        **PLAN.resources("runs"),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm evaluate --config {params.run_dir:q}/resolved.yaml "
        "--checkpoint {params.run_dir:q}/final.pt {params.full:q} --output {output:q} > {log:q} 2>&1"


rule plot_curves:
    input:
        PLAN.run_results(),
    output:
        table=f"{RUNS_REPORT_DIR}/report.md",
        table_html=report(
            f"{RUNS_REPORT_DIR}/table.html",
            caption="../report/runs-table.rst",
            category="Training runs",
        ),
        comparison=f"{RUNS_REPORT_DIR}/comparison.json",
        curves=report(
            f"{RUNS_REPORT_DIR}/learning-curves.png",
            caption="../report/learning-curves.rst",
            category="Training runs",
        ),
    params:
        runs=runs_root,
        outdir=output_parent,
    log:
        "logs/plot_curves/runs.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm report --runs {params.runs:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
