"""How long a trainer takes to write its resumable state (what it must do inside Slurm's signal window).

    python benchmarks/state_save.py --config 20m 90m --repeat 3 --dir /tmp/state-save

For each preset: build the engine on the CPU, run one optimizer update (so AdamW's moments exist, as in a
real state), then time what the trainer does on SIGTERM: ``engine.state_dict()`` plus ``save_state``
(torch.save to a temporary file, fsync, rename) of ``latest.pt``, ``--repeat`` times; prints one JSON object
with the file size and every timing. The context is shortened (it changes no parameter) so the update stays
cheap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from tiny_llm.budget import parameter_count
from tiny_llm.config import load_recipe
from tiny_llm.engines import build_engine
from tiny_llm.runtime.device import setup_runtime
from tiny_llm.train import checkpoint


def measure(preset: str, directory: Path, repeat: int, threads: int) -> dict:
    sets = [
        "runtime.device=cpu",
        "runtime.compile=false",
        f"runtime.cpu_threads={threads}",
        "model.context_length=64",
        "training.batch_tokens=64",
        "training.micro_batch_size=1",
    ]
    recipe = load_recipe([preset], sets)
    engine = build_engine(recipe, setup_runtime(recipe))
    blocks = torch.randint(0, recipe.model.vocab_size, (1, recipe.model.context_length + 1))
    engine.train_step(blocks, recipe.optimizer.lr, 0)
    path = directory / f"{preset}-latest.pt"
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        state = {"engine": engine.state_dict(), "rng": checkpoint.rng_state()}
        checkpoint.save_state(path, state)
        seconds.append(round(time.perf_counter() - start, 3))
    size = path.stat().st_size
    path.unlink()
    return {
        "preset": preset,
        "parameters": parameter_count(recipe.model),
        "state_bytes": size,
        "seconds": seconds,
        "median_seconds": statistics.median(seconds),
        "mib_per_second": round(size / 2**20 / statistics.median(seconds), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["20m", "90m"], help="presets to measure")
    parser.add_argument("--dir", type=Path, required=True, help="where the state files are written")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    results = [measure(preset, args.dir, args.repeat, args.threads) for preset in args.config]
    print(json.dumps({"directory": str(args.dir.resolve()), "results": results}, indent=2))


if __name__ == "__main__":
    main()
