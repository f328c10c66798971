# Plain training runs: results/runs/<run>/result.json and an evaluation of the final checkpoint.
# The trainer keeps its resumable state (latest.pt, metrics, best.json) beside result.json in the run
# directory; only result.json is declared, so Snakemake never deletes that state and `--resume auto` picks it
# up on a rerun.


rule train_run:
    input:
        cache=cache_dir(),
    output:
        f"{RUNS_DIR}/{{run}}/result.json",
    params:
        recipe=run_recipe_args,
        run_dir=run_dir,
        numerics=NUMERICS_VERSION,
    log:
        "logs/train_run/{run}.log",
    threads: size_threads(run_size)
    resources:
        **size_resources(run_size),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm train {params.recipe} --set runtime.output_dir={params.run_dir} "
        "--set runtime.cpu_threads={threads} --resume auto > {log} 2>&1"


rule evaluate_run:
    input:
        result=f"{RUNS_DIR}/{{run}}/result.json",
    output:
        f"{RUNS_DIR}/{{run}}/evaluation.json",
    params:
        run_dir=run_dir,
        full=run_evaluate_flags,
    log:
        "logs/evaluate_run/{run}.log",
    threads: size_threads(run_size)
    resources:
        **size_resources(run_size),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm evaluate --config {params.run_dir}/resolved.yaml "
        "--checkpoint {params.run_dir}/final.pt {params.full} --output {output} > {log} 2>&1"
