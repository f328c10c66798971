# Helpers of the packed stage's rules (rules/packed.smk): functions only, torch-free.

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


def packed_targets() -> list[str]:
    targets = packed_run_results()
    if targets:
        targets += [f"{PACKED_REPORT_DIR}/report.md", f"{PACKED_REPORT_DIR}/learning-curves.png"]
    if packed_bench():
        targets.append(f"{PACKED_BENCH_DIR}/summary.json")
    return targets


def packed_runs_root(wildcards) -> str:
    return PACKED_DIR
