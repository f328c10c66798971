"""`tune`: the staged throughput tuner (plan, one candidate, select, or everything in one go)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import REBUILD_TUNING, ConfigError
from tiny_llm.io import parse_yaml, read_json_mapping
from tiny_llm.recorded import without_record, write_recorded_json


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    plan = sub.add_parser("plan", help="write plan.json for a tuning profile")
    _profile_arguments(plan)
    plan.add_argument("--output", required=True, help="plan.json")
    cand = sub.add_parser("candidate", help="measure, reuse or skip one slot of a plan")
    cand.add_argument("--plan", required=True)
    cand.add_argument("--slot", required=True)
    cand.add_argument("--results-dir", required=True)
    sel = sub.add_parser("select", help="write summary.json, progress.json and selected.yaml")
    sel.add_argument("--plan", required=True)
    sel.add_argument("--results-dir", required=True)
    sel.add_argument("--plot", help="also draw the per-stage throughput plot here (PNG)")
    run = sub.add_parser("run", help="plan, run every slot in turn and select (no Snakemake)")
    _profile_arguments(run)
    run.add_argument("--results-dir", required=True)
    run.add_argument("--plot", help="per-stage throughput plot (PNG)")


def _profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="profile name (gh200, h200, cpu, ...)")
    parser.add_argument(
        "--profile",
        required=True,
        help="the profile mapping (configs, overrides, protocol) as YAML/JSON text, or @FILE for a YAML file",
    )


def _profile_mapping(text: str) -> dict[str, Any]:
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise ConfigError(f"--profile: file not found: {path}")
        text = path.read_text(encoding="utf-8")
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--profile: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError("--profile: expected a mapping of tuning profile settings")
    return data


def _make_plan(args: argparse.Namespace):
    from tiny_llm.tuning.candidates import make_plan, profile_from_dict

    return make_plan(profile_from_dict(args.name, _profile_mapping(args.profile)))


def _load_plan(path: str):
    from tiny_llm.tuning.candidates import plan_from_dict

    if not Path(path).is_file():
        raise ConfigError(f"--plan: file not found: {path}")
    rebuild = "delete it and rerun the same command: `tiny-llm tune plan` writes it again"
    return plan_from_dict(without_record(read_json_mapping(path, rebuild)))


def _print_result(result: dict[str, Any]) -> None:
    print(json.dumps({k: result.get(k) for k in ("name", "status", "tokens_per_second")}), flush=True)


def run(args: argparse.Namespace) -> int:
    from tiny_llm.tuning import tuner

    if args.action == "plan":
        write_recorded_json(args.output, _make_plan(args).to_dict(), "tune plan")
        return 0
    if args.action == "candidate":
        result = tuner.run_candidate(_load_plan(args.plan), args.slot, args.results_dir)
        print(json.dumps({k: result.get(k) for k in ("name", "status", "tokens_per_second", "reused_from")}))
        return 0
    if args.action == "select":
        plan = _load_plan(args.plan)
    else:
        plan = _make_plan(args)
        write_recorded_json(Path(args.results_dir) / "plan.json", plan.to_dict(), "tune run")
        tuner.run_slots(plan, args.results_dir, on_result=_print_result)
    try:
        summary = tuner.select(plan, args.results_dir)
    finally:
        summary_path = Path(args.results_dir) / "summary.json"
        if args.plot and summary_path.is_file():
            tuner.plot_summary(read_json_mapping(summary_path, REBUILD_TUNING), args.plot)
    print(
        json.dumps({"selected": summary["selected"]["name"], "budget_exhausted": summary["budget_exhausted"]})
    )
    return 0
