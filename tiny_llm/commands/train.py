"""`train`: run (or resume) one training recipe into runtime.output_dir."""

from __future__ import annotations

import argparse

from tiny_llm.cli import add_recipe_arguments, recipe_from_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument(
        "--resume",
        metavar="PATH|auto",
        help="state file to resume, or 'auto': the run directory's newest valid state, else a fresh start",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no console progress lines (run.log still gets them)"
    )


def run(args: argparse.Namespace) -> int:
    recipe = recipe_from_args(args)
    from tiny_llm.runner import run_training

    return run_training(recipe, resume=args.resume, quiet=args.quiet)
