"""`samples`: report tables of exported models and their sample continuations (torch-free)."""

from __future__ import annotations

import argparse
import json

from tiny_llm.export.samples import write_samples_report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exports", required=True, nargs="+", metavar="DIR", help="export directories (tiny-llm export)"
    )
    parser.add_argument(
        "--output-dir",
        required=True,
        metavar="OUT",
        help="where models.html, samples.html, exports.md and exports.json go",
    )


def run(args: argparse.Namespace) -> int:
    print(json.dumps(write_samples_report(args.exports, args.output_dir), indent=2))
    return 0
