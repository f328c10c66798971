# Staged throughput tuner (target `tuning`): results/<profile>-tuning/{profile.yaml, plan.json,
# candidates/<slot>.json, selected.yaml, summary.json, progress.json, throughput.png} (paths: pipeline/layout.py).
# Every candidate is its own job and process; slots are named by stage and parent *rank* (s2-r0-flash = stage 2,
# flash applied to the best of the earlier stages), so the DAG is static. Each slot waits for every slot before
# it: candidates run one at a time on the device, and the time budget is the sum of the wall times of the slots
# before (deterministic on a rerun). progress.json is rewritten by every candidate and is not a declared output.


wildcard_constraints:
    profile=r"[A-Za-z0-9_]+",
    slot=r"s[0-9]+(-r[0-9]+)?-[A-Za-z0-9_-]+",


rule plan_tuning:
    input:
        profile=tuning_profile,
    output:
        TUNING_PLAN,
    log:
        "logs/plan_tuning/{profile}.log",
    benchmark:
        "logs/plan_tuning/{profile}.tsv"
    localrule: True
    conda:
        "../envs/torch.yaml"
    params:
        plan=plan_file_digests,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm tune plan --name {wildcards.profile:q} --profile @{input.profile:q} --output {output:q} "
        "> {log:q} 2>&1"


rule bench_candidate:
    input:
        unpack(candidate_inputs),
    output:
        TUNING_CANDIDATE,
    log:
        "logs/bench_candidate/{profile}-{slot}.log",
    benchmark:
        "logs/bench_candidate/{profile}-{slot}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: PLAN.threads("tuning")  # locally all cores: nothing runs beside a timed job
    resources:
        **PLAN.resources("tuning"),
    params:
        plan=plan_file_digests,
        results=tuning_results,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm tune candidate --plan {input.plan:q} --slot {wildcards.slot:q} "
        "--results-dir {params.results:q} > {log:q} 2>&1"


rule select_tuning:
    input:
        plan=tuning_schedule,
        candidates=all_candidates,
    output:
        selected=TUNING_SELECTED,
        summary=TUNING_SUMMARY,
        plot=report(
            TUNING_PLOT,
            caption="../report/tuning-throughput.rst",
            category="Tuning",
            subcategory="{profile}",
        ),
    log:
        "logs/select_tuning/{profile}.log",
    benchmark:
        "logs/select_tuning/{profile}.tsv"
    localrule: True
    conda:
        "../envs/report.yaml"
    params:
        plan=plan_file_digests,
        results=tuning_results,
    shell:
        "TINY_LLM_PLAN_FILES={params.plan:q} "
        "python -m tiny_llm tune select --plan {input.plan:q} --results-dir {params.results:q} "
        "--plot {output.plot:q} > {log:q} 2>&1"
