"""Sync-free update: the fused engine's device-side finite guard against a host read of every update.

Two engines with the same seeded weights and fused AdamW run the same batches: `deferred` (the engine as it
is: found_inf on the device, values read once per window) and `per-update read` (the same engine made to read
each update's loss and gradient norm at once, the previous behaviour). Windows of `--steps` updates alternate
between the two in one process; each window's time is the process's CPU seconds with `--clock cpu` (one
thread), else wall seconds with the device synchronised at both ends. Prints one JSON object with the median
seconds per update of each and the ratio per-update-read / deferred (> 1: the sync-free update is faster).

With `--packed` the same comparison runs for the packed engine (N workers, fused packed AdamW; default
recipe packed4-demo): `deferred` skips a non-finite update's mixing and step on the device, `per_update_read`
reads the workers' losses and norms every update (and skips the clipping pass when no worker clips).

Example:
    python benchmarks/update_sync.py --config demo-s --threads 1 --clock cpu
    python benchmarks/update_sync.py --packed --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.runtime.device import setup_runtime, synchronize
from tiny_llm.train.engine import ModelEngine

CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default=None, help="preset or recipe YAML (the shape); default demo-s, packed4-demo"
    )
    parser.add_argument("--packed", action="store_true", help="the packed engine (a decentralized recipe)")
    parser.add_argument("--set", action="append", default=[], help="dotted.key=value, as for train")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="updates per window")
    parser.add_argument("--windows", type=int, default=7)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall")
    return parser.parse_args(argv)


def build(recipe: RecipeConfig, device: torch.device, packed: bool) -> dict[str, Any]:
    """Two engines from the same seed; the second made to check every update at once, as before."""
    if packed:
        engines: dict[str, Any] = {
            "deferred": PackedEngine(recipe, device),
            "per_update_read": PackedEngine(recipe, device),
        }
        plain = engines["per_update_read"]
        plain.guard, plain.optimizer.found_inf = None, None  # the per-update read of the unfused path
        return engines
    engines = {"deferred": ModelEngine(recipe, device), "per_update_read": ModelEngine(recipe, device)}
    engines["per_update_read"].deferred_check = False  # the synchronous check of the unfused path
    del engines["per_update_read"].optimizer.found_inf
    return engines


def weights(engine: Any) -> list[torch.Tensor]:
    return [engine.model.arena] if isinstance(engine, PackedEngine) else engine.params


def window(engine: Any, batches: list[torch.Tensor], first_step: int, clock) -> float:
    """Seconds per update over one window; the values are read at its end, as the training loop does."""
    synchronize(engine.device)
    start = clock()
    stats = [engine.train_step(b, 1e-3, first_step + i) for i, b in enumerate(batches)]
    engine.check_finite()
    [s.read() for s in stats]
    synchronize(engine.device)
    return (clock() - start) / len(batches)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = args.config or ("packed4-demo" if args.packed else "demo-s")
    sets = [*args.set, f"runtime.cpu_threads={args.threads}", "runtime.fused_optimizer=true"]
    recipe = load_recipe([config], sets)
    device = setup_runtime(recipe)
    engines = build(recipe, device, args.packed)
    blocks = recipe.training.batch_tokens // recipe.model.context_length
    gen = torch.Generator().manual_seed(0)
    shape = (args.steps, blocks, recipe.model.context_length + 1)
    batches = list(torch.randint(0, recipe.model.vocab_size, shape, generator=gen))
    clock = CLOCK[args.clock]
    for engine in engines.values():  # warm-up (compilation, optimizer state)
        window(engine, batches[:2], 1, clock)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for w in range(args.windows):
        for name, engine in engines.items():
            times[name].append(window(engine, batches, 3 + w * args.steps, clock))
    median = {name: statistics.median(t) for name, t in times.items()}
    pairs = zip(weights(engines["deferred"]), weights(engines["per_update_read"]), strict=True)
    same = all(torch.equal(p, q) for p, q in pairs)
    out = {
        "config": config,
        "packed": args.packed,
        "sets": args.set,
        "device": str(device),
        "threads": args.threads,
        "clock": args.clock,
        "steps_per_window": args.steps,
        "seconds_per_update": median,
        "window_seconds_per_update": times,
        "ratio_per_update_read_to_deferred": median["per_update_read"] / median["deferred"],
        "same_weights": same,
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
