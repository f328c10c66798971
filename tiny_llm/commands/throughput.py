"""`throughput point|report|estimate`: the steps of the throughput map (what the workflow's rules call).

- ``point``: measure one size x context x microbatch in its own benchmark-worker process and write its record
  (an out-of-memory is a result: the command succeeds).
- ``report``: the summary JSON, the Markdown table and the plot of finished points.
- ``estimate``: the map's GPU hours at most, from a workflow config, before anything runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tiny_llm.errors import ConfigError


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    point = sub.add_parser("point", help="measure one point of the map")
    point.add_argument("--recipe", required=True, help="the size's recipe YAML")
    point.add_argument("--context", type=int, required=True)
    point.add_argument("--micro", type=int, required=True)
    point.add_argument("--trial", choices=("first", "confirm"), default="first")
    point.add_argument("--data-mode", choices=("real", "synthetic"), default="real")
    point.add_argument("--warmup", type=int, default=20)
    point.add_argument("--steps", type=int, default=100)
    point.add_argument("--windows", type=int, default=3)
    point.add_argument("--max-windows", type=int, default=0, help="more windows while the spread is wide")
    point.add_argument("--max-spread", type=float, default=0.05)
    point.add_argument(
        "--timeout-seconds", type=float, default=600, help="a point's timeout before its own work is added"
    )
    point.add_argument(
        "--timeout-flops-per-second",
        type=float,
        default=None,
        help="the slowest rate a point may keep: its FLOPs at this rate add to its timeout (default 1e14)",
    )
    point.add_argument("--output", required=True, help="the point's record (JSON, written last)")
    report = sub.add_parser("report", help="summary, table and plot of finished points")
    report.add_argument("points", nargs="*", help="finished point records (<size>/ctx<L>/m<M>-<trial>.json)")
    report.add_argument("--parameters", required=True, help="size=P,... (parameters of each size)")
    report.add_argument("--summary", required=True)
    report.add_argument("--table", required=True)
    report.add_argument("--plot", required=True)
    estimate = sub.add_parser("estimate", help="GPU hours of a workflow config's map, at most")
    estimate.add_argument("--workflow-config", required=True, metavar="YAML")


def _parameters(text: str) -> dict[str, int]:
    try:
        return {size: int(count) for size, count in (item.split("=") for item in text.split(",") if item)}
    except ValueError:
        raise ConfigError(f"--parameters: expected size=P,..., got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    from tiny_llm.tuning import throughput_map

    if args.action == "point":
        protocol = {k: getattr(args, k) for k in throughput_map.PROTOCOL_KEYS}
        if protocol["timeout_flops_per_second"] is None:
            protocol["timeout_flops_per_second"] = throughput_map.TIMEOUT_FLOPS_PER_SECOND
        if not protocol["timeout_flops_per_second"] > 0 or not protocol["timeout_seconds"] > 0:
            raise ConfigError("--timeout-seconds and --timeout-flops-per-second: must be > 0")
        record = throughput_map.run_point(
            Path(args.recipe), args.context, args.micro, Path(args.output), protocol, args.trial
        )
        print(json.dumps({k: record.get(k) for k in ("status", "tokens_per_second", "error")}))
        if record["status"] in ("failed", "timeout"):
            print(
                f"point {args.output} measured nothing: {throughput_map.stopped_by([record])}; to measure it "
                "again, run the same command (in the workflow: the throughput target with --forcerun "
                f"{args.output})",
                file=sys.stderr,
            )
    elif args.action == "report":
        paths = [Path(p) for p in args.points]
        summary = throughput_map.write_report(
            paths, _parameters(args.parameters), Path(args.summary), Path(args.table), Path(args.plot)
        )
        print(throughput_map.table(summary))
    else:
        from tiny_llm.config import read_config_source
        from tiny_llm.pipeline.plan import build_plan
        from tiny_llm.pipeline.schema import find_schema, load_schema

        schema = load_schema(find_schema(Path(args.workflow_config)))
        plan = build_plan(read_config_source(args.workflow_config), schema, precheck_campaign=False)
        result = plan.throughput.estimate()
        print(
            f"throughput map: {result['lines']} lines, at most {result['points_at_most']} points, "
            f"at most {result['gpu_hours_at_most']} GPU hours",
            file=sys.stderr,
        )
        print(json.dumps(result, indent=2))
    return 0
