"""`prepare`: build (or verify and reuse) the token cache at data.cache_dir."""

from __future__ import annotations

import argparse
import json

from tiny_llm.cli import add_recipe_arguments, recipe_from_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.data.prepare import prepare_cache

    result = prepare_cache(recipe_from_args(args), progress=not args.no_progress)
    print(json.dumps(result.as_dict(), indent=2))
    return 0
