# Trained models leave the pipeline (target `export`): Hugging Face Llama directories that load offline with
# transformers (config.json, model.safetensors, generation_config.json, the cache's tokenizer, a model card;
# model.gguf for llama.cpp with export.gguf), each sampled on the configured prompts, and their report.
#
# results/exports/prompts.yaml                     the prompts and sampling settings (written by write_plan_file)
# results/exports/<run>/                           every plain run's final weights
# results/exports/best-<size>/                     the best campaign run of each size (its last stage's ranking)
# results/report/exports/{models,samples}.html     exported models with their losses, and their continuations
# (paths: tiny_llm/pipeline/layout.py)


# An export directory's name could also be a run's: results/exports/prompts.yaml is a plan file, best-<size> the
# best campaign run of a size.
ruleorder: write_plan_file > export_best > export_run


rule export_run:
    input:
        result=RUN_RESULT,
        prompts=EXPORT_PROMPTS,
    output:
        directory(EXPORT_RUN),
    log:
        "logs/export_run/{run}.log",
    benchmark:
        "logs/export_run/{run}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("export")
    resources:
        **PLAN.resources("export"),
    params:
        plan=plan_file_digests,
        run_dir=input_parent,
        options=words(PLAN.export.options()),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm export --run {params.run_dir:q} --prompts {input.prompts:q} {params.options:q} "
        "--output {output:q} > {log:q} 2>&1"


rule export_best:
    input:
        ranking=export_ranking,
        prompts=EXPORT_PROMPTS,
    output:
        directory(EXPORT_BEST),
    log:
        "logs/export_best/{size}.log",
    benchmark:
        "logs/export_best/{size}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("export")
    resources:
        **PLAN.resources("export"),
    params:
        plan=plan_file_digests,
        options=words(PLAN.export.options()),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm export --best-of {input.ranking:q} --prompts {input.prompts:q} {params.options:q} "
        "--output {output:q} > {log:q} 2>&1"


rule report_exports:
    input:
        PLAN.export.directories(),
    output:
        models=report(
            EXPORTS_MODELS,
            caption="../report/exports-models.rst",
            category="Exported models",
        ),
        samples=report(
            EXPORTS_SAMPLES,
            caption="../report/exports-samples.rst",
            category="Exported models",
        ),
        table=EXPORTS_TABLE,
        json=EXPORTS_JSON,
    log:
        "logs/report_exports/exports.log",
    benchmark:
        "logs/report_exports/exports.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        outdir=output_parent,
    shell:
        "python -m tiny_llm samples --exports {input:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
