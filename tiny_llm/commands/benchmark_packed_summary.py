"""`benchmark-packed-summary`: speedups of packed over sequential from worker results, and a plot."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_llm.errors import DataError
from tiny_llm.io import atomic_write_json, read_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", nargs="+", required=True, help="benchmark-packed-worker result JSONs")
    parser.add_argument("--output", required=True, help="summary JSON")
    parser.add_argument("--plot", help="speedup / peak-memory figure (PNG)")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.bench.packed_summary import plot_summary, summarize

    results = []
    for path in args.inputs:
        try:
            results.append(read_json(path))
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: not a readable benchmark result ({exc})") from None
    try:
        summary = summarize(results)
    except ValueError as exc:
        raise DataError(f"benchmark-packed-summary: {exc}") from None
    atomic_write_json(args.output, summary)
    if args.plot:
        plot_summary(summary, Path(args.plot))
    for row in summary["rows"]:
        print(json.dumps({k: row[k] for k in ("num_models", "compile", "speedup", "memory_ratio")}))
    return 0
