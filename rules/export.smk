# Trained models leave the pipeline (target `export`): Hugging Face Llama directories that load offline with
# transformers (config.json, model.safetensors, generation_config.json, the cache's tokenizer, a model card),
# each sampled on the configured prompts, and their report.
#
# results/exports/prompts.yaml                     the prompts and sampling settings (written by write_plan_file)
# results/exports/<run>/                           every plain run's final weights
# results/exports/best-<size>/                     the best campaign run of each size (its last stage's ranking)
# results/report/exports/{models,samples}.html     exported models with their losses, and their continuations


rule export_run:
    input:
        result=f"{RUNS_DIR}/{{run}}/result.json",
        prompts=EXPORT_PROMPTS,
    output:
        directory(f"{EXPORTS_DIR}/{{run}}"),
    params:
        run_dir=input_parent,
        dtype=config["export"]["dtype"],
    log:
        "logs/export_run/{run}.log",
    wildcard_constraints:
        run=PLAN.export.run_pattern(),
    threads: 2
    resources:
        mem_mb=8000,
        runtime=30,
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm export --run {params.run_dir:q} --prompts {input.prompts:q} --dtype {params.dtype:q} "
        "--output {output:q} > {log:q} 2>&1"


rule export_best:
    input:
        ranking=export_ranking,
        prompts=EXPORT_PROMPTS,
    output:
        directory(f"{EXPORTS_DIR}/best-{{size}}"),
    params:
        dtype=config["export"]["dtype"],
    log:
        "logs/export_best/{size}.log",
    wildcard_constraints:
        size=PLAN.export.size_pattern(),
    threads: 2
    resources:
        mem_mb=8000,
        runtime=30,
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm export --best-of {input.ranking:q} --prompts {input.prompts:q} --dtype {params.dtype:q} "
        "--output {output:q} > {log:q} 2>&1"


rule report_exports:
    input:
        PLAN.export.directories(),
    output:
        models=report(
            f"{EXPORTS_REPORT_DIR}/models.html",
            caption="../report/exports-models.rst",
            category="Exported models",
        ),
        samples=report(
            f"{EXPORTS_REPORT_DIR}/samples.html",
            caption="../report/exports-samples.rst",
            category="Exported models",
        ),
        table=f"{EXPORTS_REPORT_DIR}/exports.md",
        json=f"{EXPORTS_REPORT_DIR}/exports.json",
    params:
        outdir=output_parent,
    log:
        "logs/report_exports/exports.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm samples --exports {input:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
