"""`report --runs DIR --output-dir OUT`: comparison table, JSON, learning curves and best recipes."""

from __future__ import annotations

import argparse
import json

from tiny_llm.report import write_report


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", required=True, metavar="DIR", help="directory holding run directories")
    parser.add_argument("--output-dir", required=True, metavar="OUT", help="where the report files go")
    parser.add_argument(
        "--require-size",
        action="append",
        default=[],
        metavar="SIZE",
        help="fail unless SIZE has a finished run (its selected-SIZE.yaml is written); repeatable",
    )


def run(args: argparse.Namespace) -> int:
    summary = write_report(args.runs, args.output_dir, args.require_size)
    print(json.dumps(summary, indent=2))
    return 0
