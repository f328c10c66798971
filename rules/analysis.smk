# Second-order analysis (target `analysis`, SPEC §11): gradient noise x Hessian at a run's saved checkpoints.
# Every (run, checkpoint, data case) is one job, so a cluster runs them side by side and a rerun skips finished
# ones; a killed job resumes at its next sample (its samples/ and state live beside result.json).
#
# results/analysis/<analysed_run>/<settings_tag>/
#     <checkpoint_name>-<case>/result.json     statistics of one job (manifest.json beside)
#     {summary.csv, manifest.json, alignment.png, noise-alignment.png, norms.png}     the run's summary
#
# <settings_tag> names the measured settings (s32-r32-seed42, ...): other settings go to a new directory;
# <checkpoint_name> is a saved state of the run (epoch-003, final). Paths: tiny_llm/pipeline/layout.py.


wildcard_constraints:
    analysed_run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    settings_tag=r"[A-Za-z0-9_-]+",
    checkpoint_name=r"epoch-[0-9][0-9][0-9]+|final",
    case=r"seen|unseen",


rule analyze_checkpoint:
    input:
        ready=analysed_run_ready,
        cache=PLAN.data.cache_manifest,
    output:
        ANALYSIS_JOB,
    log:
        "logs/analyze_checkpoint/{analysed_run}/{settings_tag}/{checkpoint_name}-{case}.log",
    benchmark:
        "logs/analyze_checkpoint/{analysed_run}/{settings_tag}/{checkpoint_name}-{case}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("analysis")
    resources:
        **PLAN.resources("analysis"),
    params:
        source=analysed_run_source,
        flags=analysis_flags,
        outdir=output_parent,
    shell:
        "python -m tiny_llm analyze {params.source:q} --checkpoint {wildcards.checkpoint_name:q} {params.flags:q} "
        "--threads {threads:q} --output {params.outdir:q} > {log:q} 2>&1"


rule summarize_analysis:
    input:
        analysis_jobs,
    output:
        summary=ANALYSIS_SUMMARY,
        manifest=ANALYSIS_MANIFEST,
        alignment=report(
            ANALYSIS_ALIGNMENT,
            caption="../report/analysis-alignment.rst",
            category="Second-order analysis",
            subcategory="{analysed_run}",
        ),
        noise=report(
            ANALYSIS_NOISE,
            caption="../report/analysis-noise.rst",
            category="Second-order analysis",
            subcategory="{analysed_run}",
        ),
        norms=report(
            ANALYSIS_NORMS,
            caption="../report/analysis-norms.rst",
            category="Second-order analysis",
            subcategory="{analysed_run}",
        ),
    log:
        "logs/summarize_analysis/{analysed_run}/{settings_tag}.log",
    benchmark:
        "logs/summarize_analysis/{analysed_run}/{settings_tag}.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        outdir=output_parent,
        metrics=analysis_metrics,
    shell:
        "python -m tiny_llm analysis-summary --inputs {input:q} --output-dir {params.outdir:q} "
        "{params.metrics:q} > {log:q} 2>&1"
