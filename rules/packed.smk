# Packed decentralized training (SPEC §7): N models trained together in one process on one device.
#
# results/packed/<run>/result.json                 training runs of packed presets (state beside result.json)
# results/packed-benchmarks/<exec>-n<N>-<mode>.json one benchmark-packed-worker process per execution, N and mode
#                                                  (exec: packed | sequential, mode: compiled | eager; a Chrome
#                                                  trace <...>.trace.json beside it, not declared)
# results/packed-benchmarks/summary.json, speedup.png   speedup = sequential s/step / packed s/step, peak memory
# results/report/packed/{report.md, comparison.json, learning-curves.png}   table and curves of the packed runs
#
# A packed recipe = the size's preset <- the packed preset <- recipe_defaults, size and run overrides <- data.

from tiny_llm.config import deep_merge, load_recipe
from tiny_llm.errors import ConfigError

PACKED_DIR = "results/packed"
PACKED_BENCH_DIR = "results/packed-benchmarks"
PACKED_REPORT_DIR = "results/report/packed"
BENCH_MODES = {"compiled": True, "eager": False}


def packed_section() -> dict:
    return config.get("packed", {})


def packed_recipe_args(size: str, preset: str, overrides: dict) -> str:
    return recipe_args(size, overrides, configs=(preset,))


def load_packed_recipe(size: str, preset: str, overrides: dict, where: str):
    """Validate a packed recipe when the workflow is parsed (same merge as packed_recipe_args)."""
    if size not in config["sizes"]:
        raise WorkflowError(f"{where}.size: unknown size '{size}'; sizes: {', '.join(config['sizes'])}")
    sets = [f"{key}={set_value(value)}" for key, value in flatten(size_overrides(size, overrides))]
    try:
        recipe = load_recipe([config["sizes"][size]["preset"], preset], sets)
    except ConfigError as exc:
        raise WorkflowError(f"{where}: {exc}") from None
    if recipe.decentralized is None:
        raise WorkflowError(f"{where}.preset: '{preset}' is not a packed recipe (no decentralized section)")
    return recipe


# ----------------------------------------------------------------------------- training runs


def packed_runs() -> dict:
    return packed_section().get("runs", {})


def packed_run_results() -> list[str]:
    return [f"{PACKED_DIR}/{run}/result.json" for run in packed_runs()]


def packed_run_spec(wildcards) -> dict:
    return packed_runs()[wildcards.packed_run]


def packed_run_size(wildcards) -> str:
    return packed_run_spec(wildcards)["size"]


def packed_run_args(wildcards) -> str:
    spec = packed_run_spec(wildcards)
    return packed_recipe_args(spec["size"], spec["preset"], spec.get("overrides", {}))


def packed_run_dir(wildcards) -> str:
    return f"{PACKED_DIR}/{wildcards.packed_run}"


for _run, _spec in packed_runs().items():
    register_recipe(load_packed_recipe(_spec["size"], _spec["preset"], _spec.get("overrides", {}), f"packed.runs.{_run}"))


# ----------------------------------------------------------------------------- benchmark


def packed_bench() -> dict | None:
    return packed_section().get("benchmark")


def bench_overrides(num_models: int, mode: str) -> dict:
    """N workers at the benchmark's fixed global batch (micro = global / (N x context)), compiled or eager."""
    bench = packed_bench()
    base = load_packed_recipe(bench["size"], bench["preset"], bench.get("overrides", {}), "packed.benchmark")
    context = base.model.context_length
    global_tokens = bench.get("global_batch_tokens") or base.training.batch_tokens
    micro = global_tokens // (num_models * context)
    if micro < 1 or micro * num_models * context != global_tokens:
        raise WorkflowError(
            f"packed.benchmark.global_batch_tokens: {global_tokens} is not num_models x micro x context "
            f"for num_models={num_models}, context={context}; pick a multiple of {num_models * context}"
        )
    packed = {
        "decentralized": {"num_models": num_models},
        "training": {"batch_tokens": global_tokens, "micro_batch_size": micro},
        "runtime": {"compile": BENCH_MODES[mode]},
    }
    return deep_merge(bench.get("overrides", {}), packed)


def bench_files() -> list[str]:
    bench = packed_bench()
    if not bench:
        return []
    modes = [mode for mode, compiled in BENCH_MODES.items() if compiled in bench.get("compile", [True, False])]
    return [
        f"{PACKED_BENCH_DIR}/{execution}-n{n}-{mode}.json"
        for n in bench.get("num_models", [4, 8])
        for mode in modes
        for execution in ("packed", "sequential")
    ]


def bench_args(wildcards) -> str:
    bench = packed_bench()
    overrides = bench_overrides(int(wildcards.n), wildcards.mode)
    return packed_recipe_args(bench["size"], bench["preset"], overrides)


def bench_protocol(wildcards) -> str:
    bench = packed_bench()
    return (
        f"--warmup {bench.get('warmup', 3)} --steps {bench.get('steps', 10)} "
        f"--component-steps {bench.get('component_steps', 3)}"
    )


def bench_threads(wildcards) -> int:
    return packed_bench().get("threads", 8)


def bench_resources() -> dict:
    def gpu(wildcards) -> int:
        return int(uses_gpu(packed_bench()["size"]))

    def mem_mb(wildcards, attempt) -> int:
        return packed_bench().get("mem_mb", 16000)

    def runtime(wildcards, attempt) -> int:
        return packed_bench().get("runtime_minutes", 30) * attempt

    return {"gpu": gpu, "mem_mb": mem_mb, "runtime": runtime}


if packed_bench():
    for _n in packed_bench().get("num_models", [4, 8]):
        for _mode in BENCH_MODES:
            bench_overrides(_n, _mode)  # fail at parse time, naming the key, on an impossible batch


wildcard_constraints:
    packed_run=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    execution=r"packed|sequential",
    n=r"[0-9]+",
    mode=r"compiled|eager",


rule train_packed:
    input:
        cache=cache_dir(),
    output:
        f"{PACKED_DIR}/{{packed_run}}/result.json",
    params:
        recipe=packed_run_args,
        run_dir=packed_run_dir,
        numerics=NUMERICS_VERSION,
    log:
        "logs/train_packed/{packed_run}.log",
    threads: size_threads(packed_run_size)
    resources:
        **size_resources(packed_run_size),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm train {params.recipe} --set runtime.output_dir={params.run_dir} "
        "--set runtime.cpu_threads={threads} --resume auto > {log} 2>&1"


rule bench_packed:
    output:
        f"{PACKED_BENCH_DIR}/{{execution}}-n{{n}}-{{mode}}.json",
    params:
        recipe=bench_args,
        protocol=bench_protocol,
    log:
        "logs/bench_packed/{execution}-n{n}-{mode}.log",
    threads: bench_threads  # all of them: a benchmark must not share the CPU with other jobs
    resources:
        **bench_resources(),
    conda:
        "../envs/torch.yaml"
    shell:
        "python -m tiny_llm benchmark-packed-worker {params.recipe} --set runtime.cpu_threads={threads} "
        "--execution {wildcards.execution} {params.protocol} --output {output} > {log} 2>&1"


rule summarize_packed_bench:
    input:
        bench_files(),
    output:
        summary=f"{PACKED_BENCH_DIR}/summary.json",
        plot=report(
            f"{PACKED_BENCH_DIR}/speedup.png",
            caption="../report/packed-benchmark.rst",
            category="Packed training",
        ),
    log:
        "logs/summarize_packed_bench/summary.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm benchmark-packed-summary --inputs {input} --output {output.summary} "
        "--plot {output.plot} > {log} 2>&1"


rule report_packed:
    input:
        packed_run_results(),
    output:
        table=report(
            f"{PACKED_REPORT_DIR}/report.md",
            caption="../report/packed-runs.rst",
            category="Packed training",
        ),
        comparison=f"{PACKED_REPORT_DIR}/comparison.json",
        curves=report(
            f"{PACKED_REPORT_DIR}/learning-curves.png",
            caption="../report/packed-curves.rst",
            category="Packed training",
        ),
    params:
        runs=PACKED_DIR,
        outdir=PACKED_REPORT_DIR,
    log:
        "logs/report_packed/packed.log",
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "python -m tiny_llm report --runs {params.runs} --output-dir {params.outdir} > {log} 2>&1"


def packed_targets() -> list[str]:
    targets = packed_run_results()
    if targets:
        targets += [f"{PACKED_REPORT_DIR}/report.md", f"{PACKED_REPORT_DIR}/learning-curves.png"]
    if packed_bench():
        targets.append(f"{PACKED_BENCH_DIR}/summary.json")
    return targets


rule packed:
    input:
        packed_targets(),


register_stage("packed", packed_targets(), enabled=packed_section().get("default_target", True))
