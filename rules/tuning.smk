# Staged throughput tuner (target `tuning`): results/<profile>-tuning/{profile.yaml, plan.json,
# candidates/<slot>.json, selected.yaml, summary.json, progress.json, throughput.png}. Every candidate is its own
# job and process; slots are named by stage and parent *rank* (s2-r0-flash = stage 2, flash applied to the best
# of the earlier stages), so the DAG is static. Each slot waits for every slot before it: candidates run one at
# a time on the device, and the time budget is the sum of the wall times of the slots before (deterministic on
# a rerun). progress.json is rewritten by every candidate and is not a declared output.


wildcard_constraints:
    profile=r"[A-Za-z0-9_]+",
    slot=r"s[0-9]+(-r[0-9]+)?-[A-Za-z0-9_-]+",


rule plan_tuning:
    input:
        profile=tuning_profile,
    output:
        "results/{profile}-tuning/plan.json",
    log:
        "logs/plan_tuning/{profile}.log",
    localrule: True
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm tune plan --name {wildcards.profile:q} --profile @{input.profile:q} --output {output:q} "
        "> {log:q} 2>&1"


rule bench_candidate:
    input:
        unpack(candidate_inputs),
    output:
        "results/{profile}-tuning/candidates/{slot}.json",
    params:
        results=tuning_results,
    log:
        "logs/bench_candidate/{profile}-{slot}.log",
    threads: PLAN.threads("tuning")  # locally all cores: nothing runs beside a timed job
    resources:
        **PLAN.resources("tuning"),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm tune candidate --plan {input.plan:q} --slot {wildcards.slot:q} "
        "--results-dir {params.results:q} > {log:q} 2>&1"


rule select_tuning:
    input:
        plan=tuning_plan,
        candidates=all_candidates,
    output:
        selected="results/{profile}-tuning/selected.yaml",
        summary="results/{profile}-tuning/summary.json",
        plot=report(
            "results/{profile}-tuning/throughput.png",
            caption="../report/tuning-throughput.rst",
            category="Tuning",
            subcategory="{profile}",
        ),
    params:
        results=tuning_results,
    log:
        "logs/select_tuning/{profile}.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm tune select --plan {input.plan:q} --results-dir {params.results:q} "
        "--plot {output.plot:q} > {log:q} 2>&1"
