"""`python -m tiny_llm <command>` / `tiny-llm <command>`.

Each subcommand lives in its own module, which exposes
``configure_parser(parser)`` and ``run(args) -> int``. The module is imported
only when its command runs, so `--help` and light commands stay fast and
torch-free.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from tiny_llm import __version__
from tiny_llm.errors import TinyLLMError

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("tiny_llm.commands.train", "train (or resume) one recipe into runtime.output_dir"),
    "launch": ("tiny_llm.commands.launch", "start a training job's runtime.num_gpus ranks on this node"),
    "evaluate": ("tiny_llm.commands.evaluate", "validation loss of a checkpoint as JSON"),
    "describe": ("tiny_llm.commands.describe", "print a recipe's parameters, budget and cache needs as JSON"),
    "resolve": ("tiny_llm.commands.resolve", "print a merged, validated recipe as YAML"),
    "build-demo-corpus": ("tiny_llm.commands.build_demo_corpus", "write the demo corpus as C4-format shards"),
    "train-tokenizer": ("tiny_llm.commands.train_tokenizer", "train a byte-level BPE tokenizer (demo)"),
    "prepare": ("tiny_llm.commands.prepare", "build, or verify and reuse, the token cache"),
    "campaign": ("tiny_llm.commands.campaign", "plan / select / rank the stages of the recipe campaign"),
    "report": ("tiny_llm.commands.report", "tables, JSON, learning curves and best recipes of runs"),
    "benchmark-worker": ("tiny_llm.commands.benchmark_worker", "measure training throughput of a recipe"),
    "tune": ("tiny_llm.commands.tune", "staged throughput tuner: plan, candidate, select, run"),
    "benchmark-packed-worker": ("tiny_llm.commands.benchmark_packed_worker", "time packed vs sequential N"),
    "benchmark-packed-summary": ("tiny_llm.commands.benchmark_packed_summary", "packed speedups and plot"),
    "analyze": ("tiny_llm.commands.analyze", "gradient noise x Hessian at one checkpoint, one data case"),
    "analysis-summary": ("tiny_llm.commands.analysis_summary", "summary.csv and figures of analysis jobs"),
    "export": ("tiny_llm.commands.export", "a checkpoint as a Hugging Face model directory"),
    "generate": ("tiny_llm.commands.generate", "continue a prompt with a checkpoint (KV cache)"),
    "samples": ("tiny_llm.commands.samples", "tables of exported models and their samples (report)"),
    "horizons-report": ("tiny_llm.commands.horizons_report", "loss against horizon of a WSD horizon study"),
    "noise": (
        "tiny_llm.commands.noise",
        "noise study: each seed source's share of the variance; its estimate",
    ),
    "fit": ("tiny_llm.commands.fit", "scaling laws of finished runs: fit, predict a run, report, estimate"),
    "fork-server": ("tiny_llm.commands.fork_server", "fork a local workflow's jobs from one warm process"),
    "throughput": ("tiny_llm.commands.throughput", "throughput map: one point, its report, its estimate"),
}


def add_recipe_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--config (preset name or YAML path, repeatable) and --set dotted.key=value (repeatable)."""
    from tiny_llm.config import preset_names

    parser.add_argument(
        "--config",
        action="append",
        required=required,
        default=None,
        metavar="C",
        help=f"preset name ({', '.join(preset_names())}) or YAML file; repeat to merge in order",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one dotted key (value parsed as YAML); repeatable",
    )


def recipe_from_args(args: argparse.Namespace):  # -> RecipeConfig
    from tiny_llm.config import load_recipe

    return load_recipe(args.config or [], args.set)


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiny-llm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"tiny-llm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def check_workflow_inputs() -> None:
    """A workflow job's plan files are the plan's (the rule passes their digests; tiny_llm.pipeline.files)."""
    expected = os.environ.get("TINY_LLM_PLAN_FILES", "")
    if expected:
        from tiny_llm.pipeline.files import check_plan_files

        check_plan_files(expected)


ON_THEIR_OWN = ("launch", "fork-server")
"""Commands a fork server never runs: launch's ranks (each rank's environment is its own) and the server
itself. The timed workers are served: forked and started alone, they measured the same throughput within
the windows' noise, 3 s sooner (benchmarks/README.md, "The last cuts")."""


def _forwarded(name: str, argv: list[str]) -> int | None:
    """The exit status of the command run by a local workflow's fork server, None where none takes it."""
    from tiny_llm.runtime.forkserver import FORK_SERVER_ENV, forward, may_forward

    path = os.environ.get(FORK_SERVER_ENV)
    if not path or name in ON_THEIR_OWN or not may_forward():
        return None
    return forward(path, argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = _top_parser()
        if argv and not argv[0].startswith("-"):
            parser.error(f"unknown command '{argv[0]}'")
        parser.parse_args(argv or ["--help"])
        return 0
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    if (code := _forwarded(name, argv)) is not None:
        return code
    try:
        check_workflow_inputs()
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=f"tiny-llm {name}", description=help_text)
        module.configure_parser(parser)
        args = parser.parse_args(rest)
        return int(module.run(args) or 0)
    except TinyLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
