"""The ordinary engine's Muon step on its own: seconds per `optimizer.step()` and the operators it dispatches.

Builds the engine of a preset (default 20m) under `optimizer.name: muon` on the CPU with the production
settings (fused AdamW, the device-side skip of a non-finite update), gives every parameter a random gradient
once, and times `engine.optimizer.step()` alone: one untimed step (Muon's lazy buffers), then --steps timed
ones, median reported. The operator count (one step under a dispatch mode that counts aten calls) is what a
GPU pays one launch each for; on a CPU the seconds are the Newton-Schulz matmuls. Prints one JSON object.

    python benchmarks/muon_step.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tiny_llm.config import load_recipe
from tiny_llm.train.engine import ModelEngine


class OpCount(TorchDispatchMode):
    """Counts the aten operators dispatched while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="20m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sets = ["optimizer.name=muon", "runtime.device=cpu", "runtime.fused_optimizer=true"]
    engine = ModelEngine(load_recipe([args.config], sets), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    for param in engine.params:
        param.grad = torch.randn(param.shape, generator=gen) * 1e-3
    engine.optimizer.step()  # Muon's momentum buffers, AdamW's moments
    with OpCount() as ops:
        engine.optimizer.step()
    seconds = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.optimizer.step()
        seconds.append(time.perf_counter() - start)
    out = {
        "config": args.config,
        "threads": args.threads,
        "step_seconds_median": round(statistics.median(seconds), 4),
        "step_seconds": [round(s, 4) for s in seconds],
        "operators_per_step": ops.count,
        "torch": torch.__version__,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
