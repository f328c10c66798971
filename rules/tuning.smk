# Staged throughput tuner (target `tuning`): results/<profile>-tuning/{plan.json, candidates/<slot>.json,
# selected.yaml, summary.json, progress.json, throughput.png}. Every candidate is its own job and process; slots are
# named by stage and parent *rank* (s2-r0-flash = stage 2, flash applied to the best of the earlier stages), so the
# DAG is static. Each slot waits for every slot before it: candidates run one at a time on the device, and the
# time budget is the sum of the wall times of the slots before (deterministic on a rerun). progress.json is
# rewritten by every candidate and is not a declared output.


include: "tuning_common.smk"


wildcard_constraints:
    profile=r"[A-Za-z0-9_]+",
    slot=r"s[0-9]+(-r[0-9]+)?-[A-Za-z0-9_-]+",


rule plan_tuning:
    output:
        f"{TUNING_DIR}/plan.json",
    params:
        profile=tuning_profile_arg,
    log:
        "logs/plan_tuning/{profile}.log",
    localrule: True
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm tune plan --name {wildcards.profile} --profile {params.profile} --output {output} "
        "> {log} 2>&1"


rule bench_candidate:
    input:
        unpack(candidate_inputs),
    output:
        f"{TUNING_DIR}/candidates/{{slot}}.json",
    params:
        results=tuning_dir,
    log:
        "logs/bench_candidate/{profile}-{slot}.log",
    threads: tuning_threads
    resources:
        tuning_device=1,
        gpu=tuning_gpu,
        mem_mb=tuning_mem_mb,
        runtime=candidate_runtime,
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm tune candidate --plan {input.plan} --slot {wildcards.slot} "
        "--results-dir {params.results} > {log} 2>&1"


rule select_tuning:
    input:
        plan=f"{TUNING_DIR}/plan.json",
        candidates=all_candidates,
    output:
        selected=f"{TUNING_DIR}/selected.yaml",
        summary=f"{TUNING_DIR}/summary.json",
        plot=report(
            f"{TUNING_DIR}/throughput.png",
            caption="../report/tuning-throughput.rst",
            category="Tuning",
            subcategory="{profile}",
        ),
    params:
        results=tuning_dir,
    log:
        "logs/select_tuning/{profile}.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm tune select --plan {input.plan} --results-dir {params.results} "
        "--plot {output.plot} > {log} 2>&1"


rule tuning:
    input:
        tuning_selected(config.get("tuning", {}).get("default_profiles", [])),


for _name in tuning_profiles():
    tuning_slots(_name)  # fail at parse time, naming the key, on a bad profile

register_stage("tuning", tuning_selected(config.get("tuning", {}).get("default_profiles", [])))
