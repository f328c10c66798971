# Second-order analysis (target `analysis`, SPEC §11): gradient noise x Hessian at a run's saved checkpoints.
# Every (run, checkpoint, data case) is one job, so a cluster runs them side by side and a rerun skips finished
# ones; a killed job resumes at its next sample (its samples/ and state live beside result.json).
#
# results/analysis/<run>/<settings>/<checkpoint>-<case>/result.json   statistics of one job (manifest.json beside)
# results/analysis/<run>/<settings>/{summary.csv, manifest.json, alignment.png, noise-alignment.png, norms.png}
#
# <settings> names the measured settings (s32-r32-seed42, ...): other settings go to a new directory.


wildcard_constraints:
    aname=PLAN.analysis.name_pattern(),
    atag=r"[A-Za-z0-9_-]+",
    checkpoint=r"epoch-[0-9][0-9][0-9]+|final",
    case=r"seen|unseen",


rule analyze_checkpoint:
    input:
        ready=analysed_run_ready,
        cache=ancient(PLAN.cache_manifest),
    output:
        f"{ANALYSIS_DIR}/{{aname}}/{{atag}}/{{checkpoint}}-{{case}}/result.json",
    params:
        source=analysed_run_source,
        flags=analysis_flags,
        outdir=output_parent,
    log:
        "logs/analyze_checkpoint/{aname}/{atag}/{checkpoint}-{case}.log",
    threads: PLAN.threads("analysis")
    resources:
        **PLAN.resources("analysis"),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm analyze {params.source:q} --checkpoint {wildcards.checkpoint:q} {params.flags:q} "
        "--threads {threads:q} --output {params.outdir:q} > {log:q} 2>&1"


rule summarize_analysis:
    input:
        analysis_jobs,
    output:
        summary=f"{ANALYSIS_DIR}/{{aname}}/{{atag}}/summary.csv",
        manifest=f"{ANALYSIS_DIR}/{{aname}}/{{atag}}/manifest.json",
        alignment=report(
            f"{ANALYSIS_DIR}/{{aname}}/{{atag}}/alignment.png",
            caption="../report/analysis-alignment.rst",
            category="Second-order analysis",
            subcategory="{aname}",
        ),
        noise=report(
            f"{ANALYSIS_DIR}/{{aname}}/{{atag}}/noise-alignment.png",
            caption="../report/analysis-noise.rst",
            category="Second-order analysis",
            subcategory="{aname}",
        ),
        norms=report(
            f"{ANALYSIS_DIR}/{{aname}}/{{atag}}/norms.png",
            caption="../report/analysis-norms.rst",
            category="Second-order analysis",
            subcategory="{aname}",
        ),
    params:
        outdir=output_parent,
        metrics=analysis_metrics,
    log:
        "logs/summarize_analysis/{aname}/{atag}.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm analysis-summary --inputs {input:q} --output-dir {params.outdir:q} "
        "{params.metrics:q} > {log:q} 2>&1"
