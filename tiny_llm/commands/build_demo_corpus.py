"""`build-demo-corpus`: the embedded offline demo corpus as C4-format local shards."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        required=True,
        help="directory to write c4-{train,validation}.*.json.gz into (new, or empty)",
    )
    parser.add_argument("--force", action="store_true", help="replace an earlier demo corpus in --output")
    parser.add_argument(
        "--validation-fraction", type=float, default=0.05, help="share of documents held out (default 0.05)"
    )


def run(args: argparse.Namespace) -> int:
    from tiny_llm.data.corpus import build_demo_corpus

    counts = build_demo_corpus(Path(args.output), args.validation_fraction, force=args.force)
    print(json.dumps({"output": args.output, **counts}, indent=2))
    return 0
