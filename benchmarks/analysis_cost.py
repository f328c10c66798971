"""Cost of the second-order analysis: one Hessian-vector product against one gradient, and whole jobs.

Part 1 (every ``--shapes``): one microbatch of random tokens through a seeded model on the reference attention
path (FP32), timed as the analysis runs it (``tiny_llm.analysis.hessian.curvature_pass``): the gradient alone,
then passes with K = 1 and K = ``--directions`` directions (the forward and first backward shared by the K
products). Best of ``--trials`` (taking turns) after one warm-up each. The ratio per product = pass seconds /
K / gradient seconds (goal: <= 2.5). The 20m microbatch is CPU-sized (``--micro 20m=2``); the ratio hardly
depends on it.

Part 2 (``--job NAME:S:R:K[:amp]`` repeatable, demo-s shape): a fabricated run directory (a synthetic token
cache with the budget plus one more epoch, the seeded initial weights saved as epoch-001.safetensors) analysed
with ``run_analysis`` for each case in ``--cases``, S noise samples, R Rademacher directions, K directions per
pass (amp: BF16 autocast); wall and CPU seconds per (checkpoint, case) in this process (a command adds its
start-up: ``startup``).

Prints one JSON object. Example:
    python benchmarks/analysis_cost.py --shapes demo-s 20m --threads 2 \
        --job defaults:32:32:8 --job demo:2:2:4 --cases seen unseen
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import save_file

from tiny_llm.analysis.hessian import FlatParameters, curvature_pass, model_loss
from tiny_llm.analysis.job import run_analysis
from tiny_llm.analysis.settings import AnalysisConfig
from tiny_llm.budget import make_budget
from tiny_llm.config import load_recipe, recipe_to_dict
from tiny_llm.data.cache import compatibility_fields
from tiny_llm.data.prepare import write_token_cache
from tiny_llm.model import Llama, count_parameters
from tiny_llm.runtime.device import keep_cpu_heap

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def best_interleaved(fns: dict[str, object], trials: int, clock: str = "wall") -> dict[str, float]:
    """The fastest of ``trials`` runs of each function, taking turns (after one warm-up each), so that a busy
    spell of a shared machine slows every variant alike instead of one of them. ``clock`` cpu: this process's
    CPU seconds (with one thread, what the work costs whatever else runs on the machine)."""
    now = CLOCKS[clock]
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(trials):
        for name, fn in fns.items():
            start = now()
            fn()
            times[name].append(now() - start)
    return {name: min(values) for name, values in times.items()}


def product_cost(shape: str, micro: int, directions: int, trials: int, amp: bool, clock: str) -> dict:
    recipe = load_recipe([shape])
    cfg = recipe.model
    torch.manual_seed(0)
    model = Llama(cfg, reference_attention=True)
    flat = FlatParameters(list(model.parameters()))
    loss_fn = model_loss(model, amp=amp)
    generator = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, cfg.vocab_size, (micro, cfg.context_length + 1), generator=generator)
    targets = micro * cfg.context_length
    vectors = [torch.randn(flat.size, generator=generator) for _ in range(directions)]

    def run(k: int):
        return lambda: curvature_pass(loss_fn, flat, [blocks], targets, vectors[:k], gradient=k == 0)

    timed = best_interleaved({"gradient": run(0), "one": run(1), "many": run(directions)}, trials, clock)
    grad, one, many = timed["gradient"], timed["one"], timed["many"]
    return {
        "shape": shape,
        "parameters": count_parameters(model),
        "micro_batch": micro,
        "context_length": cfg.context_length,
        "amp": amp,
        "clock": clock,
        "gradient_seconds": grad,
        "hvp_k1_seconds": one,
        f"pass_k{directions}_seconds": many,
        "hvp_over_gradient_k1": one / grad,
        f"hvp_over_gradient_k{directions}": many / directions / grad,
    }


def fabricated_run(root: Path, shape: str) -> Path:
    """A run directory of ``shape`` (resolved.yaml, epoch-001.safetensors of the seeded initial weights) on a
    synthetic cache holding the budget plus one more epoch."""
    run_dir = root / "run"
    run_dir.mkdir(parents=True)
    recipe = load_recipe([shape], [f"data.cache_dir={root / 'cache'}", f"runtime.output_dir={run_dir}"])
    budget = make_budget(recipe)
    tokens = (budget.num_blocks + budget.epoch_boundaries[0]) * recipe.model.context_length + 1
    rng = np.random.default_rng(0)
    stub = {k: None for k in ("vocab_size", "dataset", "dataset_revision", "tokenizer", "tokenizer_revision")}
    stub["preprocessing"] = {"shuffle_seed": None, "shuffle_buffer": None}
    wanted = {key.split(".")[-1]: value for key, _, value in compatibility_fields(stub, recipe)}
    write_token_cache(
        root / "cache",
        rng.integers(0, recipe.model.vocab_size, tokens),
        rng.integers(0, recipe.model.vocab_size, 10_000),
        shard_tokens=recipe.data.shard_tokens,
        vocab_size=wanted["vocab_size"],
        dataset=wanted["dataset"],
        dataset_revision=wanted["dataset_revision"],
        tokenizer=wanted["tokenizer"],
        tokenizer_revision=wanted["tokenizer_revision"],
        preprocessing={
            "shuffle_seed": wanted["shuffle_seed"],
            "shuffle_buffer": wanted["shuffle_buffer"],
            "append_eos": True,
            "add_special_tokens": False,
        },
    )
    (run_dir / "resolved.yaml").write_text(yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False))
    torch.manual_seed(recipe.runtime.seed)
    save_file(Llama(recipe.model).state_dict(), str(run_dir / "epoch-001.safetensors"))
    return run_dir


def job_cost(run_dir: Path, spec: str, case: str, threads: int) -> dict:
    """``spec`` NAME:S:R:K, optionally :amp."""
    name, s, r, k, *amp = spec.split(":")
    settings = AnalysisConfig(
        case=case,
        noise_samples="all" if s == "all" else int(s),
        random_samples=int(r),
        directions_per_pass=int(k),
        amp=amp == ["amp"],
        threads=threads,
    )
    lines: list[str] = []
    start, cpu = time.perf_counter(), time.process_time()
    result = run_analysis(run_dir, "epoch-001", run_dir.parent / f"{name}-{case}", settings, log=lines.append)
    return {
        "job": name,
        "case": case,
        "noise_samples": result["statistics"]["noise_samples"],
        "random_samples": int(r),
        "directions_per_pass": int(k),
        "amp": settings.amp,
        "passes": sum(line.startswith("  pass") for line in lines),
        "targets": result["data"]["num_targets"],
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
    }


def startup_seconds() -> dict[str, float]:
    """Start-up of an analyze process before any work: python, torch and the analysis modules."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import tiny_llm.analysis.job"], check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"seconds": wall, "cpu_seconds": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=["demo-s", "20m"])
    parser.add_argument("--micro", nargs="*", default=["demo-s=16", "20m=2"], metavar="SHAPE=N")
    parser.add_argument("--directions", type=int, default=8, help="K of the shared pass (default 8)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--amp", action="store_true", help="also time BF16 autocast")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="part 1 (cpu: CPU seconds)")
    parser.add_argument("--job", action="append", default=[], metavar="NAME:S:R:K[:amp]")
    parser.add_argument("--job-shape", default="demo-s")
    parser.add_argument("--cases", nargs="+", default=["seen"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_cpu_heap()  # as setup_runtime does for a CPU job
    micro = {k: int(v) for k, v in (item.split("=") for item in args.micro)}
    out: dict = {
        "machine": platform.processor() or platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "products": [],
        "jobs": [],
    }
    for shape in args.shapes:
        for amp in (False, True) if args.amp else (False,):
            row = product_cost(shape, micro.get(shape, 1), args.directions, args.trials, amp, args.clock)
            out["products"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.job:
        out["startup"] = startup_seconds()
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = fabricated_run(Path(tmp), args.job_shape)
            for spec in args.job:
                for case in args.cases:
                    row = job_cost(run_dir, spec, case, args.threads)
                    out["jobs"].append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
