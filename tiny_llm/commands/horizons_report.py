"""`horizons-report --runs DIR... --output-dir OUT`: the horizon study's table, JSON and loss-vs-horizon plot
(torch-free)."""

from __future__ import annotations

import argparse
import json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runs", nargs="+", required=True, metavar="DIR", help="finished branch run directories"
    )
    parser.add_argument("--output-dir", required=True, metavar="OUT", help="where the report files go")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.report.horizons import write_horizons_report

    rows = write_horizons_report(args.runs, args.output_dir)
    print(json.dumps({"horizons": [r["tokens_per_parameter"] for r in rows]}))
    return 0
