"""`resolve`: merge and validate a recipe, print it (or write it atomically)."""

from __future__ import annotations

import argparse

from tiny_llm.cli import add_recipe_arguments, recipe_from_args
from tiny_llm.config import dump_recipe
from tiny_llm.io import atomic_write_text


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--output", help="write the YAML here instead of printing it")


def run(args: argparse.Namespace) -> int:
    text = dump_recipe(recipe_from_args(args))
    if args.output:
        atomic_write_text(args.output, text)
    else:
        print(text, end="")
    return 0
