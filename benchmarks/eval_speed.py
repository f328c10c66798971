"""Evaluation speed: the compiled evaluation (hidden states + chunked fused loss) against the eager one.

Both run the library's own `evaluate_batches` on the same seeded model and the same random token batches
(the shape's context and evaluation batch size), alternating trials in one process after a warm-up pass of
each (the compiled one's includes its compilation, reported apart). Each trial's time is the process's CPU
seconds on the CPU with `--clock cpu` (with one thread the figure other jobs on a shared machine cannot
distort), else wall seconds (device synchronised). Prints one JSON object: tokens/s of each, the median
ratio compiled / eager, and the two losses with their relative difference.

The library compiles evaluation on CUDA only (on a CPU a run's compiles cost more than they save); this
benchmark compiles on whatever device it runs on, to measure the compiled path itself.

Example:
    python benchmarks/eval_speed.py --config demo-s --threads 1 --clock cpu
    python benchmarks/eval_speed.py --config 20m --set runtime.device=cuda --batches 4 --trials 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from tiny_llm.config import load_recipe
from tiny_llm.runtime.device import setup_runtime, synchronize
from tiny_llm.runtime.engine import build_model
from tiny_llm.train import evaluate
from tiny_llm.train.evaluate import evaluate_batches

CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="demo-s", help="preset or recipe YAML (the shape)")
    parser.add_argument("--set", action="append", default=[], help="dotted.key=value, as for train")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=8, help="evaluation batches per trial")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall")
    return parser.parse_args(argv)


def timed_pass(model, batches, recipe, device, clock) -> tuple[float, float]:
    """(seconds, mean loss) of one evaluation pass over ``batches``."""
    synchronize(device)
    start = clock()
    loss, _ = evaluate_batches(model, batches, recipe, device)
    synchronize(device)
    return clock() - start, loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    evaluate.COMPILED_DEVICE_TYPES = frozenset({"cpu", "cuda"})  # the compiled path on any device
    sets = [*args.set, f"runtime.cpu_threads={args.threads}"]
    recipes = {
        mode: load_recipe([args.config], [*sets, f"runtime.compile={mode == 'compiled'}"])
        for mode in ("eager", "compiled")
    }
    device = setup_runtime(recipes["eager"])
    model = build_model(recipes["eager"], device).eval()
    cfg, batch = recipes["eager"].model, recipes["eager"].evaluation.batch_size
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, cfg.vocab_size, (args.batches, batch, cfg.context_length + 1), generator=gen)
    batches = [(b[:, :-1], b[:, 1:]) for b in blocks]
    tokens = args.batches * batch * cfg.context_length
    clock = CLOCK[args.clock]
    first = {mode: timed_pass(model, batches, recipes[mode], device, clock) for mode in recipes}
    times: dict[str, list[float]] = {mode: [] for mode in recipes}
    for _ in range(args.trials):
        for mode, recipe in recipes.items():
            times[mode].append(timed_pass(model, batches, recipe, device, clock)[0])
    median = {mode: statistics.median(t) for mode, t in times.items()}
    losses = {mode: first[mode][1] for mode in recipes}
    out = {
        "config": args.config,
        "sets": args.set,
        "device": str(device),
        "threads": args.threads,
        "clock": args.clock,
        "tokens_per_trial": tokens,
        "first_pass_seconds": {mode: first[mode][0] for mode in recipes},
        "tokens_per_second": {mode: tokens / median[mode] for mode in recipes},
        "trial_seconds": times,
        "ratio_compiled_to_eager": median["eager"] / median["compiled"],
        "losses": losses,
        "loss_relative_difference": abs(losses["compiled"] - losses["eager"]) / abs(losses["eager"]),
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
