"""`analysis-summary --inputs DIR... --output-dir OUT [--metrics RUN/metrics.jsonl]`: summary.csv,
manifest.json and figures of finished analysis jobs (torch-free)."""

from __future__ import annotations

import argparse
import json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--inputs", nargs="+", required=True, metavar="DIR", help="analysis job directories (or result.json)"
    )
    parser.add_argument("--output-dir", required=True, metavar="OUT", help="where the summary files go")
    parser.add_argument("--metrics", default=None, help="the run's metrics.jsonl: training's gradient norms")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.analysis.summary import write_summary

    manifest = write_summary(args.inputs, args.output_dir, args.metrics)
    print(json.dumps({k: manifest[k] for k in ("rows", "files", "identity")}))
    return 0
