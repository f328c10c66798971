"""`train`: run (or resume) one training recipe into runtime.output_dir."""

from __future__ import annotations

import argparse
from pathlib import Path

from tiny_llm.cli import add_recipe_arguments, recipe_from_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_recipe_arguments(parser)
    parser.add_argument(
        "--resume",
        metavar="PATH|auto",
        help="state file to resume, or 'auto': the run directory's newest valid state, else a fresh start",
    )
    parser.add_argument(
        "--set-aside-changed",
        action="store_true",
        help="when runtime.output_dir holds a run of another recipe, rename it to <dir>.replaced-N (all but "
        "the --config files) and start afresh, instead of refusing",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no console progress lines (run.log still gets them)"
    )
    parser.add_argument(
        "--stop-at-step",
        type=int,
        metavar="N",
        help="stop after update N keeping its state (step-NNNNNNN.pt, latest.pt), status 'stopped', "
        "stopped.json last; rerunning continues nothing past N (a trunk of several horizons)",
    )
    parser.add_argument(
        "--keep-state-at",
        type=int,
        nargs="+",
        default=[],
        metavar="N",
        help="also keep the state after each update N as step-NNNNNNN.pt (branch points)",
    )
    parser.add_argument(
        "--from-state",
        type=Path,
        metavar="PATH",
        help="start from another run's state when the run directory holds none: the recipes may differ "
        "only in training.tokens_per_parameter, with the same updates so far (needs data.shuffle_group_size)",
    )
    parser.add_argument(
        "--record-divergence",
        action="store_true",
        help="a run that stops on a non-finite loss writes a 'diverged' result.json and exits 0 "
        "(a campaign ranks it last); any other failure still fails",
    )


def run(args: argparse.Namespace) -> int:
    recipe = recipe_from_args(args)
    from tiny_llm.engines import run_training
    from tiny_llm.errors import ConfigError
    from tiny_llm.train.session import Continuation

    if args.from_state is not None and not args.from_state.is_file():
        raise ConfigError(f"--from-state: no state file {args.from_state}")
    steps = [s for s in (args.stop_at_step, *args.keep_state_at) if s is not None]
    if any(s < 1 for s in steps):
        raise ConfigError("--stop-at-step/--keep-state-at: steps must be >= 1")
    plan = Continuation(args.stop_at_step, tuple(args.keep_state_at), args.from_state)
    keep = tuple(
        Path(c) for c in args.config if Path(c).is_file()
    )  # the recipe stays where the rule wrote it
    code = run_training(
        recipe,
        resume=args.resume,
        quiet=args.quiet,
        plan=plan,
        set_aside_changed=args.set_aside_changed,
        keep=keep,
    )
    if code and args.record_divergence:
        return record_divergence(Path(recipe.runtime.output_dir), code)
    return code


def record_divergence(run_dir: Path, code: int) -> int:
    from tiny_llm.campaign import diverged_result
    from tiny_llm.io import atomic_write_json

    result = diverged_result(run_dir, code)
    if result is None:
        return code
    atomic_write_json(run_dir / "result.json", result)
    print(f"{run_dir} diverged ({result['error']}); recorded as a diverged result")
    return 0
