# Throughput map (target `throughput`): per size x context, benchmark-worker points at microbatch 1, 2, 4, ...
# until an out-of-memory seen twice. Which points run depends on what the earlier ones measured, so a point is
# a checkpoint and the report's inputs walk the frontier through it (pipeline/throughput.py). A point is a
# timed job (locally it takes every core: nothing runs beside it); an out-of-memory is its result, not a
# failure. Paths: pipeline/layout.py.


wildcard_constraints:
    context=r"[0-9]+",
    micro=r"[0-9]+",
    trial=r"first|confirm",


checkpoint bench_throughput:
    input:
        unpack(throughput_point_inputs),
    output:
        THROUGHPUT_POINT,
    log:
        "logs/bench_throughput/{size}-ctx{context}-m{micro}-{trial}.log",
    benchmark:
        "logs/bench_throughput/{size}-ctx{context}-m{micro}-{trial}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("throughput")  # locally all cores: nothing runs beside a timed job
    resources:
        **PLAN.resources("throughput"),
    params:
        plan=plan_file_digests,
        protocol=PLAN.throughput.protocol_flags(),
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm throughput point --recipe {input.recipe:q} --context {wildcards.context} "
        "--micro {wildcards.micro} --trial {wildcards.trial} {params.protocol} --output {output:q} > {log:q} 2>&1"


rule report_throughput:
    input:
        throughput_points,
    output:
        summary=THROUGHPUT_SUMMARY,
        table=report(THROUGHPUT_TABLE, caption="../report/throughput-table.rst", category="Throughput map"),
        plot=report(THROUGHPUT_PLOT, caption="../report/throughput-plot.rst", category="Throughput map"),
    log:
        "logs/report_throughput/throughput.log",
    benchmark:
        "logs/report_throughput/throughput.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        parameters=PLAN.throughput.parameters_flag(),
    shell:
        "python -m tiny_llm throughput report --parameters {params.parameters:q} --summary {output.summary:q} "
        "--table {output.table:q} --plot {output.plot:q} {input:q} > {log:q} 2>&1"
