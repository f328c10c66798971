"""`launch`: the ranks of one training job on this node (runtime.num_gpus), as `torchrun --standalone` starts
them, with the rendezvous in a private directory and every socket on the loopback interface, K free GPU slots
taken first (tiny_llm.train.launch).

    python -m tiny_llm launch --nproc-per-node 2 --shutdown-timeout 100 -m tiny_llm train --config ...
"""

from __future__ import annotations

import argparse
import sys


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        metavar="K",
        help="ranks to start (default: the recipe's runtime.num_gpus)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=100.0,
        metavar="S",
        help="seconds ranks get to end after a signal or a failed rank before they are killed (default 100)",
    )
    parser.add_argument(
        "-m", dest="module", required=True, metavar="MODULE", help="what each rank runs: tiny_llm"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments: train --config ...")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.errors import ConfigError
    from tiny_llm.train.launch import launch

    device, ranks = ranks_of(args.module, args.args)
    world_size = args.nproc_per_node or ranks
    if world_size < 1:
        raise ConfigError(f"--nproc-per-node: must be >= 1, got {world_size}")
    command = [sys.executable, "-m", args.module, *args.args]
    return launch(command, world_size, gpus=trains_on_gpus(device), shutdown_timeout=args.shutdown_timeout)


def ranks_of(module: str, argv: list[str]) -> tuple[str, int]:
    """(runtime.device, runtime.num_gpus) of a `tiny_llm train` command's recipe; ("auto", 1) otherwise."""
    if module != "tiny_llm" or argv[:1] != ["train"]:
        return "auto", 1
    from tiny_llm.cli import recipe_from_args
    from tiny_llm.commands import train

    parser = argparse.ArgumentParser(prog="tiny-llm train")
    train.configure_parser(parser)
    recipe = recipe_from_args(parser.parse_args(argv[1:]))
    return recipe.runtime.device, recipe.runtime.num_gpus


def trains_on_gpus(device: str) -> bool:
    """Whether the ranks train on GPUs: a CUDA device, or auto where CUDA is present. No CUDA where the job
    needs it (a cuda device, or a job given a GPU) is refused here, before any rank starts."""
    import torch

    from tiny_llm.errors import ConfigError
    from tiny_llm.runtime.device import REQUIRE_CUDA_ENV, cuda_required, no_cuda_message

    if device == "cpu":
        return False
    if torch.cuda.is_available():
        return True
    if device == "auto" and not cuda_required():
        return False
    what = f"runtime.device: '{device}' asks for CUDA"
    if device == "auto":
        what = f"this job was given a GPU ({REQUIRE_CUDA_ENV}=1)"
    raise ConfigError(no_cuda_message(what))
