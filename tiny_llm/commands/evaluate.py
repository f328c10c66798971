"""`evaluate`: validation loss of a checkpoint (.safetensors or .pt) as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_llm.cli import add_recipe_arguments


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser, required=False)
    parser.add_argument("--checkpoint", type=Path, help=".safetensors weights or .pt state (with --config)")
    parser.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="a finished run directory: its resolved.yaml and final state (final.pt, else final.safetensors)",
    )
    parser.add_argument(
        "--full", action="store_true", help="the whole validation split (default: the subset)"
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here (atomically)")


def resolve_source(args: argparse.Namespace):  # -> tuple[RecipeConfig, Path]
    """The recipe and checkpoint: --config/--set with --checkpoint, or a run directory (--run, --set on top).

    A run is evaluated from its final training state where it kept one: the model as training evaluated it
    (for a packed run, the workers' average the engine builds).
    """
    from tiny_llm.config import load_recipe
    from tiny_llm.errors import ConfigError
    from tiny_llm.export.runs import run_inputs

    if (args.run is None) == (args.checkpoint is None):
        raise ConfigError("give exactly one of --checkpoint (with --config) or --run DIR")
    if args.checkpoint is not None:
        if not args.config:
            raise ConfigError("--checkpoint needs --config (the run's resolved.yaml)")
        return load_recipe(args.config, args.set), args.checkpoint
    recipe_file, weights = run_inputs(args.run)
    state = args.run / "final.pt"
    checkpoint = state if state.is_file() else weights
    return load_recipe([str(recipe_file), *(args.config or [])], args.set), checkpoint


def run(args: argparse.Namespace) -> int:
    recipe, checkpoint = resolve_source(args)
    from tiny_llm.engines import evaluate_checkpoint
    from tiny_llm.io import atomic_write_json

    result = evaluate_checkpoint(recipe, checkpoint, full=args.full)
    if args.output:
        atomic_write_json(args.output, result)
    print(json.dumps(result, indent=2))
    return 0
