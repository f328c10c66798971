"""`describe`: plan a run before launching it."""

from __future__ import annotations

import argparse
import json

from tiny_llm.budget import describe
from tiny_llm.cli import add_recipe_arguments, recipe_from_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)


def run(args: argparse.Namespace) -> int:
    print(json.dumps(describe(recipe_from_args(args)), indent=2))
    return 0
