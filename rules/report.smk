# Reports of the plain runs (table + learning curves, also in `snakemake --report report.html`) and the
# registration of this file's stages in the default target. Stage files included later register theirs.


rule plot_curves:
    input:
        run_results(),
    output:
        table=report(
            f"{RUNS_REPORT_DIR}/report.md",
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
        "python -m tiny_llm report --runs {params.runs} --output-dir {params.outdir} > {log} 2>&1"


register_stage("data", [cache_dir()])
register_stage(
    "runs",
    run_results() + run_evaluations() + rules.plot_curves.output,
    enabled=bool(config["runs"]),
)
