"""`benchmark-worker`: measure one recipe's training throughput and write the result JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_llm.cli import add_recipe_arguments, recipe_from_args
from tiny_llm.io import atomic_write_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--output", required=True, help="result JSON (written atomically)")
    parser.add_argument("--data-mode", choices=("real", "synthetic"), default="real")
    parser.add_argument(
        "--warmup", type=int, default=20, help="updates before timing (the first timed alone)"
    )
    parser.add_argument("--steps", type=int, default=100, help="updates per timed window")
    parser.add_argument("--windows", type=int, default=3, help="timed windows; the median is reported")
    parser.add_argument(
        "--max-windows", type=int, default=0, help="more windows, up to this many, while the spread is wide"
    )
    parser.add_argument(
        "--max-spread", type=float, default=0.05, help="wide: max - min tokens/s above this of the median"
    )
    parser.add_argument(
        "--profile", action="store_true", help="also write OUTPUT.trace.json and OUTPUT.profile.txt"
    )
    parser.add_argument("--require-gpu-name", help="refuse to run unless the GPU name contains this text")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.bench.worker import WorkerOptions, run_worker

    recipe = recipe_from_args(args)
    output = Path(args.output)
    prefix = output.with_suffix("") if output.suffix == ".json" else output
    options = WorkerOptions(
        data_mode=args.data_mode,
        warmup=args.warmup,
        steps=args.steps,
        windows=args.windows,
        max_windows=args.max_windows,
        max_spread=args.max_spread,
        profile_prefix=prefix if args.profile else None,
        require_gpu_name=args.require_gpu_name,
    )
    result = run_worker(recipe, options)
    atomic_write_json(output, result)
    summary = {k: result[k] for k in ("status", "tokens_per_second", "seconds_per_step", "mfu", "error")}
    print(json.dumps(summary))
    return 0 if result["status"] == "ok" else 1
