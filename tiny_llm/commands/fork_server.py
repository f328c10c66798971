"""`fork-server`: one process that imported torch once forks each job of a local workflow run
(tiny_llm.runtime.forkserver; the controller starts and stops it, tiny_llm.pipeline.controller)."""

from __future__ import annotations

import argparse
import sys

# What a training, evaluation or analysis job imports before it does anything (about 3 s of CPU per job)
PRELOAD = (
    "torch",
    "torch._dynamo",  # the first optimizer imports it (Optimizer.add_param_group)
    "tiny_llm.engines",
    "tiny_llm.train.session",
    "tiny_llm.commands.train",
    "tokenizers",
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", required=True, metavar="PATH", help="Unix socket to listen on")
    parser.add_argument(
        "--parent", required=True, type=int, metavar="PID", help="stop, once its jobs end, when PID is gone"
    )


def run(args: argparse.Namespace) -> int:
    from tiny_llm.cli import main
    from tiny_llm.runtime.forkserver import preload, serve

    preload(PRELOAD)
    return serve(args.socket, args.parent, run=main, records=sys.stdout)
