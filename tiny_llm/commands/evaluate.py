"""`evaluate`: validation loss of a checkpoint (.safetensors or .pt) as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_llm.cli import add_recipe_arguments, recipe_from_args
from tiny_llm.io import atomic_write_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--checkpoint", required=True, type=Path, help=".safetensors weights or .pt state")
    parser.add_argument(
        "--full", action="store_true", help="the whole validation split (default: the subset)"
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here (atomically)")


def run(args: argparse.Namespace) -> int:
    recipe = recipe_from_args(args)
    from tiny_llm.engines import evaluate_checkpoint

    result = evaluate_checkpoint(recipe, args.checkpoint, full=args.full)
    if args.output:
        atomic_write_json(args.output, result)
    print(json.dumps(result, indent=2))
    return 0
