# Noise study (target `noise`): one configuration over seeds three ways, varying only the initial weights
# (runtime.seed), only the data order (training.data_seed), or both; the report gives each source's share of
# the variance (tiny_llm/pipeline/noise.py).
#
# results/noise/<size>-<init|data|both>-s<seed>/{recipe.yaml, result.json}   one run each (resumable)
# results/report/noise/{noise.json, report.md, noise.png}                   variances, shares and intervals
# (paths: tiny_llm/pipeline/layout.py)


wildcard_constraints:
    noise_run=r"[A-Za-z0-9][A-Za-z0-9._-]*-(init|data|both)-s[0-9]+",


rule train_noise:
    input:
        recipe=NOISE_RECIPE,
        cache=PLAN.data.cache_manifest,
    output:
        NOISE_RESULT,
    log:
        "logs/train_noise/{noise_run}.log",
    benchmark:
        "logs/train_noise/{noise_run}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("noise")
    resources:
        **PLAN.resources("noise"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
        launch=PLAN.launcher("noise"),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "{params.launch} tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} "
        "--resume auto --set-aside-changed > {log:q} 2>&1"


rule report_noise:
    input:
        PLAN.noise.results(),
    output:
        table=NOISE_TABLE,
        summary=NOISE_SUMMARY,
        plot=report(NOISE_PLOT, caption="../report/noise-sources.rst", category="Noise study"),
    log:
        "logs/report_noise/noise.log",
    benchmark:
        "logs/report_noise/noise.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        runs=input_parents,
        outdir=output_parent,
    shell:
        "python -m tiny_llm noise report --runs {params.runs:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
