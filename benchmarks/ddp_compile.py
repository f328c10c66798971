"""Compile time of a 2-rank compiled run on the CPU (`runtime.num_gpus: 2` through `tiny_llm launch`), with
one Inductor compile worker per rank (TORCHINDUCTOR_COMPILE_THREADS=1: no worker pool, kernels compiled one
after another) and with the ranks' default (`launch.compile_workers`: cores / 2, at least 2; on a 2-core
machine also Inductor's own default, min(32, cores)): the first train row's seconds (its window is the first
update, whose compile it holds), the run's wall time, and the same for one process, each with a cold compile
cache of its own. Prints one JSON document.

    python benchmarks/ddp_compile.py --workdir /tmp/ddp-compile [--preset tiny] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from data_parallel import build_data  # benchmarks/: the demo corpus, a 512-token BPE, a token cache


def run(workdir: Path, name: str, preset: str, sets: list[str], ranks: int, env: dict[str, str]) -> dict:
    """One compiled training run; its first update's and its whole wall time (s)."""
    run_dir = workdir / "runs" / name
    argv = ["train", "--quiet", "--config", preset]
    argv += [a for s in [*sets, f"runtime.output_dir={run_dir}"] for a in ("--set", s)]
    launcher = [sys.executable, "-m", "tiny_llm"]
    if ranks > 1:
        launcher += ["launch", "--nproc-per-node", str(ranks), "-m", "tiny_llm"]
    cache = workdir / "compile-cache" / name  # cold: a directory of its own
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "TINY_LLM_COMPILE_CACHE": str(cache), **env}
    start = time.perf_counter()
    subprocess.run([*launcher, *argv], env=environ, check=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["event"] == "train")
    return {"first_update_seconds": round(first["training_seconds"], 2), "wall_seconds": round(wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    sets = build_data(args.workdir, args.preset) + [
        "model.vocab_size=512",
        "runtime.device=cpu",
        "runtime.compile=true",
        "runtime.cpu_threads=2",
        "training.tokens_per_parameter=0.05",
        "training.epoch_tokens_per_parameter=0.05",
        "training.micro_batch_size=4",
        "training.log_every=1",
        "training.checkpoint_policy=none",
    ]
    cores = len(os.sched_getaffinity(0))
    cases = {
        "2 ranks, 1 worker each": (2, {"TORCHINDUCTOR_COMPILE_THREADS": "1"}),
        "2 ranks, the default": (2, {}),
        "1 process": (1, {}),
    }
    results: dict[str, list[dict]] = {name: [] for name in cases}
    for repeat in range(args.repeats):
        for name, (ranks, env) in cases.items():
            label = f"{name.replace(' ', '-').replace(',', '')}-{repeat}"
            ranks_sets = [*sets, f"runtime.num_gpus={ranks}"]
            results[name].append(run(args.workdir, label, args.preset, ranks_sets, ranks, env))
    setup = {"preset": args.preset, "cores": cores, "os_cpu_count": os.cpu_count(), "repeats": args.repeats}
    print(json.dumps({"setup": setup, "cases": results}, indent=1))


if __name__ == "__main__":
    main()
