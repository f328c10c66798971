"""`noise report|estimate`: the noise study's report (torch-free) and its GPU hours before anything runs.

- ``report --runs DIR... --output-dir OUT``: noise.json, report.md and noise.png of finished study runs.
- ``estimate --workflow-config YAML``: the study's runs x tokens / ``noise.throughput`` (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    report = sub.add_parser("report", help="variances, shares and the figure of finished study runs")
    report.add_argument("--runs", nargs="+", required=True, metavar="DIR", help="finished run directories")
    report.add_argument("--output-dir", required=True, metavar="OUT", help="where the report files go")
    estimate = sub.add_parser("estimate", help="GPU hours of a workflow config's noise study")
    estimate.add_argument("--workflow-config", required=True, metavar="YAML")


def run(args: argparse.Namespace) -> int:
    if args.action == "report":
        from tiny_llm.report.noise_study import write_noise_report

        summary = write_noise_report(args.runs, args.output_dir)
        print(json.dumps({g["source"]: g["share"] for g in summary["groups"]}))
        return 0
    from tiny_llm.config import read_config_source
    from tiny_llm.pipeline.plan import build_plan
    from tiny_llm.pipeline.schema import find_schema, load_schema

    schema = load_schema(find_schema(Path(args.workflow_config)))
    plan = build_plan(read_config_source(args.workflow_config), schema, precheck_campaign=False)
    result = plan.noise.estimate()
    hours = (
        "unknown (no noise.throughput)" if result["gpu_hours"] is None else f"{result['gpu_hours']:.3f} GPU-h"
    )
    print(
        f"noise study: {result['runs']} x {result['size']} x {result['tokens_per_run']:,} tokens -> {hours}",
        file=sys.stderr,
    )
    print(json.dumps(result, indent=2))
    return 0
