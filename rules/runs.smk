# Plain training runs and their report: results/runs/<run>/{recipe.yaml, result.json, evaluation.json} and
# results/report/runs/{report.md, comparison.json, learning-curves.png} (paths: tiny_llm/pipeline/layout.py).
# The trainer keeps its resumable state (latest.pt, metrics, best.json) beside result.json in the run
# directory; only result.json is declared, so Snakemake never deletes that state and `--resume auto` picks it
# up on a rerun.


rule train_run:
    input:
        recipe=RUN_RECIPE,
        cache=PLAN.data.cache_manifest,
    output:
        RUN_RESULT,
    log:
        "logs/train_run/{run}.log",
    benchmark:
        "logs/train_run/{run}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("runs")
    resources:
        **PLAN.resources("runs"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
        launch=PLAN.launcher("runs"),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "{params.launch} tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} "
        "--resume auto --set-aside-changed > {log:q} 2>&1"


rule evaluate_run:
    input:
        result=RUN_RESULT,
    output:
        RUN_EVALUATION,
    log:
        "logs/evaluate_run/{run}.log",
    benchmark:
        "logs/evaluate_run/{run}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("runs")
    resources:
        **PLAN.resources("runs"),
    params:
        run_dir=input_parent,
        full=run_evaluate_flags,
    shell:
        "python -m tiny_llm evaluate --run {params.run_dir:q} {params.full:q} --output {output:q} > {log:q} 2>&1"


rule plot_curves:
    input:
        PLAN.runs.results(),
    output:
        table=RUNS_REPORT.table,
        table_html=report(
            RUNS_REPORT.table_html,
            caption="../report/runs-table.rst",
            category="Training runs",
        ),
        comparison=RUNS_REPORT.comparison,
        curves=report(
            RUNS_REPORT.curves,
            caption="../report/learning-curves.rst",
            category="Training runs",
        ),
    log:
        "logs/plot_curves/runs.log",
    benchmark:
        "logs/plot_curves/runs.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        runs=runs_root,
        outdir=output_parent,
    shell:
        "python -m tiny_llm report --runs {params.runs:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
