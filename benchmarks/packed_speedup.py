"""Packed vs sequential speedup for several N, each measurement in its own process; prints the summary JSON.

Runs `python -m tiny_llm benchmark-packed-worker` for every (mode, N, execution) at a fixed global batch
(per-worker micro batch = global / (N x context)), packed and sequential alternating so slow drift of a shared
host hits both, then `tiny_llm.bench.packed_summary.summarize`.

Example (the small shape, eager and compiled, 2 threads):
    python benchmarks/packed_speedup.py --config packed4-tiny --set decentralized.topology=complete \
        --global-batch-tokens 1024 --num-models 4 8 --modes eager compiled --threads 2 \
        --output-dir /tmp/packed-tiny
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tiny_llm.bench.packed_summary import plot_summary, summarize
from tiny_llm.config import load_recipe
from tiny_llm.io import atomic_write_json, read_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--num-models", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--global-batch-tokens", type=int, required=True)
    parser.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--component-steps", type=int, default=3)
    parser.add_argument("--output-dir", type=Path, required=True)
    args = parser.parse_args()
    context = load_recipe(args.config, args.set).model.context_length
    args.output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for mode in args.modes:
        for n in args.num_models:
            micro = args.global_batch_tokens // (n * context)
            sets = [
                f"decentralized.num_models={n}",
                f"training.micro_batch_size={micro}",
                f"training.batch_tokens={args.global_batch_tokens}",
                f"runtime.compile={'true' if mode == 'compiled' else 'false'}",
                f"runtime.cpu_threads={args.threads}",
            ]
            for execution in ("packed", "sequential"):
                output = args.output_dir / f"{execution}-n{n}-{mode}.json"
                cmd = [sys.executable, "-m", "tiny_llm", "benchmark-packed-worker", "--execution", execution]
                cmd += [a for c in args.config for a in ("--config", c)]
                cmd += [a for s in [*args.set, *sets] for a in ("--set", s)]
                cmd += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--no-trace"]
                cmd += ["--component-steps", str(args.component_steps)]
                cmd += ["--output", str(output)]
                subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
                paths.append(output)
    summary = summarize([read_json(p) for p in paths if p.exists()])
    atomic_write_json(args.output_dir / "summary.json", summary)
    plot_summary(summary, args.output_dir / "speedup.png")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
