"""`fit law|predict|report|estimate`: the scaling fit's steps, as the workflow's rules call them (torch-free).

- ``law``: fit finished runs (and a recipe variant's, as NAME:DIR) and write fit.json.
- ``predict``: the loss (and bits per byte) fit.json expects of one recipe's run, before it trains.
- ``report``: the report page (tables, fitted curves, isoFLOP curves), with the predicted run set against its
  realised loss.
- ``estimate``: the GPU hours of a workflow config's horizon studies and verify run, before anything runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tiny_llm.errors import ConfigError


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    law = sub.add_parser("law", help="fit finished runs: fit.json")
    law.add_argument("--runs", nargs="+", required=True, metavar="DIR", help="finished run directories")
    law.add_argument(
        "--variant", nargs="+", action="append", default=[], metavar="NAME:DIR",
        help="runs of a recipe variant (its effective speedup against --runs); repeatable",
    )  # fmt: skip
    law.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates")
    law.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed")
    law.add_argument("--confidence", type=float, default=0.95, help="coverage of every interval")
    law.add_argument("--budgets", type=float, nargs="+", default=[], help="compute budgets (FLOPs)")
    law.add_argument("--output", required=True, help="fit.json (written atomically)")
    predict = sub.add_parser("predict", help="the fit's prediction of one recipe's run")
    predict.add_argument("--fit", required=True, help="fit.json")
    predict.add_argument("--recipe", required=True, help="the run's recipe YAML")
    predict.add_argument("--output", required=True, help="prediction.json (written atomically)")
    report = sub.add_parser("report", help="the fit's tables and figures")
    report.add_argument("--fit", required=True, help="fit.json")
    report.add_argument("--prediction", default=None, help="prediction.json of --verify-run")
    report.add_argument("--verify-run", default=None, metavar="DIR", help="the predicted run's directory")
    report.add_argument("--output-dir", required=True, metavar="OUT")
    estimate = sub.add_parser("estimate", help="GPU hours of a workflow config's studies and verify run")
    estimate.add_argument("--workflow-config", required=True, metavar="YAML")


def _variants(groups: list[list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in (entry for group in groups for entry in group):
        name, sep, run_dir = item.partition(":")
        if not sep or not name or not run_dir:
            raise ConfigError(f"--variant: expected NAME:DIR, got {item!r}")
        out.setdefault(name, []).append(run_dir)
    return out


def run(args: argparse.Namespace) -> int:
    if args.action == "law":
        return _law(args)
    if args.action == "predict":
        from tiny_llm.config import load_recipe
        from tiny_llm.io import atomic_write_json, read_json_mapping
        from tiny_llm.scaling.predict import prediction

        fit = read_json_mapping(args.fit, "delete it and rerun the fit (snakemake fit)")
        out = prediction(fit, load_recipe([args.recipe]), args.recipe, args.fit)
        atomic_write_json(args.output, out)
        print(json.dumps({k: out[k] for k in ("n", "d", "loss", "bpb")}))
    elif args.action == "report":
        if (args.prediction is None) != (args.verify_run is None):
            raise ConfigError("report: --prediction and --verify-run go together")
        from tiny_llm.report.fit import write_fit_report

        summary = write_fit_report(args.fit, args.output_dir, args.prediction, args.verify_run)
        print(json.dumps({"laws": summary["laws"], "verification": summary["verification"] is not None}))
    else:
        from tiny_llm.config import read_config_source
        from tiny_llm.pipeline.fit import describe_estimate
        from tiny_llm.pipeline.plan import build_plan
        from tiny_llm.pipeline.schema import find_schema, load_schema

        schema = load_schema(find_schema(Path(args.workflow_config)))
        plan = build_plan(read_config_source(args.workflow_config), schema, precheck_campaign=False)
        result = plan.fit.estimate()
        if not result["rows"]:
            raise ConfigError(f"estimate: {args.workflow_config} plans no horizon study, no fit.verify run")
        print(describe_estimate(result), file=sys.stderr)
        print(json.dumps(result, indent=2))
    return 0


def _law(args: argparse.Namespace) -> int:
    from tiny_llm.io import atomic_write_json
    from tiny_llm.scaling.fit import FitSettings, scaling_fit
    from tiny_llm.scaling.points import group_points, read_run

    if not 0 < args.confidence < 1:
        raise ConfigError(f"--confidence: between 0 and 1, got {args.confidence}")
    settings = FitSettings(args.bootstrap, args.seed, args.confidence, tuple(args.budgets))
    points = group_points([read_run(d) for d in args.runs])
    variants = {
        name: group_points([read_run(d) for d in dirs]) for name, dirs in _variants(args.variant).items()
    }
    fit = scaling_fit(points, variants, settings)
    atomic_write_json(args.output, fit)
    print(json.dumps({m: fit["fits"][m]["joint"]["parameters"] for m in fit["metrics"]}))
    return 0
