"""`benchmark-packed-worker`: time one execution (packed or sequential) of a packed recipe."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_llm.cli import add_recipe_arguments, recipe_from_args
from tiny_llm.errors import ConfigError
from tiny_llm.io import atomic_write_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--execution", required=True, choices=("packed", "sequential"))
    parser.add_argument("--output", required=True, help="result JSON (written atomically)")
    parser.add_argument("--warmup", type=int, default=3, help="updates before timing (the first timed alone)")
    parser.add_argument("--steps", type=int, default=10, help="timed updates (the median is reported)")
    parser.add_argument("--component-steps", type=int, default=3, help="updates of the component pass")
    parser.add_argument(
        "--no-trace", action="store_true", help="skip the profiled update (OUTPUT.trace.json)"
    )


def run(args: argparse.Namespace) -> int:
    from tiny_llm.bench.packed import PackedBenchOptions, run_packed_benchmark

    recipe = recipe_from_args(args)
    if recipe.decentralized is None:
        raise ConfigError(
            "benchmark-packed-worker needs a packed recipe: set decentralized.num_models "
            "(e.g. --config packed4-tiny)"
        )
    for name in ("warmup", "steps", "component_steps"):
        if getattr(args, name) < (0 if name == "component_steps" else 1):
            raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {getattr(args, name)}")
    output = Path(args.output)
    prefix = output.with_suffix("") if output.suffix == ".json" else output
    options = PackedBenchOptions(
        execution=args.execution,
        warmup=args.warmup,
        steps=args.steps,
        component_steps=args.component_steps,
        trace=None if args.no_trace else prefix.with_name(prefix.name + ".trace.json"),
    )
    result = run_packed_benchmark(recipe, options)
    atomic_write_json(output, result)
    keys = ("status", "execution", "num_models", "compile", "tokens_per_second", "seconds_per_step", "error")
    print(json.dumps({k: result[k] for k in keys if k in result}))
    return 0 if result["status"] in ("ok", "memory_limit") else 1
