"""Training throughput of build_engine(...).train_step on synthetic tokens (CPU or GPU), as JSON.

Example:
    python benchmarks/train_throughput.py --config 20m --set runtime.device=cpu --set runtime.cpu_amp=true \
        --set training.micro_batch_size=4 --set training.batch_tokens=16384 --warmup 2 --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

from tiny_llm.budget import flops_per_token, parameter_count
from tiny_llm.config import load_recipe
from tiny_llm.engines import build_engine
from tiny_llm.runtime.device import peak_memory_bytes, setup_runtime, synchronize


def matmul_peak_flops(dtype: torch.dtype, device: torch.device, size: int = 2048, repeats: int = 10) -> float:
    """Sustained square-matmul FLOP/s, the reference for MFU."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    recipe = load_recipe(args.config, args.set)
    device = setup_runtime(recipe)
    engine = build_engine(recipe, device)
    n = recipe.training.batch_tokens // recipe.model.context_length
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, recipe.model.vocab_size, (n, recipe.model.context_length + 1), generator=gen)
    start = time.perf_counter()
    engine.train_step(blocks, recipe.optimizer.lr, 0)
    first = time.perf_counter() - start
    for step in range(1, args.warmup):
        engine.train_step(blocks, recipe.optimizer.lr, step)
    times, cpu_times = [], []
    for step in range(args.steps):
        synchronize(device)
        t0, c0 = time.perf_counter(), cpu_seconds()
        engine.train_step(blocks, recipe.optimizer.lr, step)
        synchronize(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(cpu_seconds() - c0)
    seconds = statistics.median(times)
    tps = recipe.training.batch_tokens / seconds
    amp = recipe.runtime.cpu_amp if device.type == "cpu" else recipe.runtime.amp
    peak = matmul_peak_flops(torch.bfloat16 if amp else torch.float32, device)
    result = {
        "tokens_per_second": tps,
        "seconds_per_step": seconds,
        "step_seconds": times,
        # CPU seconds this process ran per step: on a shared machine, tokens per CPU-second x threads
        # estimates the throughput of a quiet one (waiting for the CPU does not count, spinning does).
        "step_cpu_seconds": cpu_times,
        "tokens_per_cpu_second": recipe.training.batch_tokens / statistics.median(cpu_times),
        "load_average": os.getloadavg(),
        "first_update_seconds": first,
        "parameters": parameter_count(recipe.model),
        "model_flops_per_second": tps * flops_per_token(recipe.model),
        "matmul_peak_flops": peak,
        "mfu": tps * flops_per_token(recipe.model) / peak,
        "peak_memory_bytes": peak_memory_bytes(device),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "settings": args.set,
        "env": {k: os.environ[k] for k in ("THP_MEM_ALLOC_ENABLE", "MALLOC_MMAP_MAX_") if k in os.environ},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
