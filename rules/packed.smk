# Packed decentralized training (SPEC §7): N models trained together in one process on one device.
#
# results/packed/<run>/{recipe.yaml, result.json}   training runs of packed presets (state beside result.json)
# results/packed-benchmarks/n<N>-<mode>/recipe.yaml the benchmark's recipe at N workers, compiled or eager
# results/packed-benchmarks/<exec>-n<N>-<mode>.json one benchmark-packed-worker process per execution, N and mode
#                                                  (exec: packed | sequential, mode: compiled | eager; a Chrome
#                                                  trace <...>.trace.json beside it, not declared)
# results/packed-benchmarks/summary.json, speedup.png   speedup = sequential s/step / packed s/step, peak memory
# results/report/packed/{report.md, comparison.json, learning-curves.png}   table and curves of the packed runs
#
# A packed recipe = the size's preset <- the packed preset <- recipe_defaults, size and run overrides <- data.
# (paths: tiny_llm/pipeline/layout.py)


wildcard_constraints:
    packed_run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    execution=r"packed|sequential",
    n=r"[0-9]+",
    mode=r"compiled|eager",


rule train_packed:
    input:
        recipe=PACKED_RECIPE,
        cache=PLAN.data.cache_manifest,
    output:
        PACKED_RESULT,
    log:
        "logs/train_packed/{packed_run}.log",
    benchmark:
        "logs/train_packed/{packed_run}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("packed")
    resources:
        **PLAN.resources("packed"),
    params:
        plan=plan_file_digests,
        numerics=NUMERICS_VERSION,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm train --config {input.recipe:q} --set runtime.cpu_threads={threads:q} --resume auto "
        "--set-aside-changed > {log:q} 2>&1"


rule bench_packed:
    input:
        recipe=PACKED_BENCH_RECIPE,
    output:
        PACKED_BENCH_RESULT,
    log:
        "logs/bench_packed/{execution}-n{n}-{mode}.log",
    benchmark:
        "logs/bench_packed/{execution}-n{n}-{mode}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("packed")  # locally all cores: nothing runs beside a timed job
    resources:
        **PLAN.resources("packed"),
    params:
        plan=plan_file_digests,
        protocol=words(PLAN.packed.bench_protocol()),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm benchmark-packed-worker --config {input.recipe:q} --execution {wildcards.execution:q} "
        "{params.protocol:q} --output {output:q} > {log:q} 2>&1"


rule summarize_packed_bench:
    input:
        PLAN.packed.bench_files(),
    output:
        summary=PACKED_BENCH_SUMMARY,
        plot=report(
            PACKED_BENCH_PLOT,
            caption="../report/packed-benchmark.rst",
            category="Packed training",
        ),
    log:
        "logs/summarize_packed_bench/summary.log",
    benchmark:
        "logs/summarize_packed_bench/summary.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm benchmark-packed-summary --inputs {input:q} --output {output.summary:q} "
        "--plot {output.plot:q} > {log:q} 2>&1"


rule report_packed:
    input:
        PLAN.packed.results(),
    output:
        table=PACKED_REPORT.table,
        table_html=report(
            PACKED_REPORT.table_html,
            caption="../report/packed-runs.rst",
            category="Packed training",
        ),
        comparison=PACKED_REPORT.comparison,
        curves=report(
            PACKED_REPORT.curves,
            caption="../report/packed-curves.rst",
            category="Packed training",
        ),
    log:
        "logs/report_packed/packed.log",
    benchmark:
        "logs/report_packed/packed.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        runs=runs_root,
        outdir=output_parent,
    shell:
        "python -m tiny_llm report --runs {params.runs:q} --output-dir {params.outdir:q} > {log:q} 2>&1"
