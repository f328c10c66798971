# Scaling fit (target `fit`): the horizon study's branches (every size; each recipe variant apart) and the runs
# fit.runs names, fitted as L(D) per size and L(N, D) jointly (tiny_llm/scaling), with bootstrap intervals.
#
# results/fit/fit.json                       parameters, intervals, residuals, R², leave-one-horizon-out error,
#                                            compute-optimal split, variants' effective speedup, the points and
#                                            their source files
# results/fit/prediction.json                the loss (and bits per byte) the fit expects of fit.verify's run
# results/fit/verify/{recipe.yaml, result.json}   that run: it takes prediction.json as an input, so the
#                                            prediction exists before it trains
# results/report/fit/{report.md, fit.html, summary.json, loss-fit.png, isoflop.png}   the report page
# (paths: tiny_llm/pipeline/layout.py)


rule fit_scaling:
    input:
        unpack(fit_law_inputs),
    output:
        FIT_JSON,
    log:
        "logs/fit_scaling/fit.log",
    benchmark:
        "logs/fit_scaling/fit.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        args=fit_law_args,
    shell:
        "python -m tiny_llm fit law {params.args:q} --output {output:q} > {log:q} 2>&1"


rule predict_run:
    input:
        fit=FIT_JSON,
        recipe=FIT_VERIFY_RECIPE,
    output:
        FIT_PREDICTION,
    log:
        "logs/predict_run/prediction.log",
    benchmark:
        "logs/predict_run/prediction.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm fit predict --fit {input.fit:q} --recipe {input.recipe:q} --output {output:q} "
        "> {log:q} 2>&1"


rule train_verify:
    input:
        recipe=FIT_VERIFY_RECIPE,
        prediction=FIT_PREDICTION,
        cache=PLAN.data.cache_manifest,
    output:
        FIT_VERIFY_RESULT,
    log:
        "logs/train_verify/verify.log",
    benchmark:
        "logs/train_verify/verify.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("fit")
    resources:
        **PLAN.resources("fit"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
        launch=PLAN.launcher("fit"),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "{params.launch} tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} "
        "--resume auto --set-aside-changed > {log:q} 2>&1"


rule report_fit:
    input:
        unpack(fit_report_inputs),
    output:
        summary=FIT_SUMMARY,
        table=FIT_TABLE,
        table_html=report(
            FIT_TABLE_HTML,
            caption="../report/fit-table.rst",
            category="Scaling fit",
        ),
        curves=report(
            FIT_CURVES,
            caption="../report/fit-curves.rst",
            category="Scaling fit",
        ),
        isoflop=report(
            FIT_ISOFLOP,
            caption="../report/fit-isoflop.rst",
            category="Scaling fit",
        ),
    log:
        "logs/report_fit/fit.log",
    benchmark:
        "logs/report_fit/fit.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        args=fit_report_args,
        outdir=output_parent,
    shell:
        "python -m tiny_llm fit report --fit {input.fit:q} {params.args:q} --output-dir {params.outdir:q} "
        "> {log:q} 2>&1"
