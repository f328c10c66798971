"""Optimizer cost, AdamW against Muon: the `optimizer` region of `benchmark-worker --profile` and peak memory.

For each shape (default the 20m, 50m and 90m presets) and each optimizer.name (adamw, muon), one
`python -m tiny_llm benchmark-worker --profile` process runs a few synthetic updates of one sequence of
--context tokens (default 256, not the presets' 1024: no parameter depends on it, and the optimizer's work
depends on the parameters only), and this script reads, from its Chrome trace, the durations of the profiled
update's named regions (`optimizer`: the whole step, Muon's Newton-Schulz and AdamW together; the others for
scale) and, from its result JSON, seconds per update and peak memory (on the CPU the process's peak resident
set, hence one process per case; on CUDA the allocator's peak). The runtime is the device's production one:
fused AdamW, and under muon torch's Muon with the device-side skip of a non-finite update (FiniteGuard).
Prints one JSON object.

Example (CPU, about 6 minutes on 2 cores):
    python benchmarks/optimizer_cost.py --device cpu --threads 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tiny_llm.budget import parameter_count

REGIONS = ("forward_and_loss", "backward", "clipping", "optimizer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["20m", "50m", "90m"], help="presets (the shapes)")
    parser.add_argument("--optimizers", nargs="+", default=["adamw", "muon"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--context", type=int, default=256, help="tokens per sequence (the parameters do not depend on it)"
    )
    parser.add_argument("--steps", type=int, default=2, help="timed updates (one window), after one warm-up")
    parser.add_argument("--set", action="append", default=[], help="more dotted.key=value, as for train")
    return parser.parse_args(argv)


def region_ms(trace_path: Path) -> dict[str, float]:
    """Milliseconds of each named region of the profiled update (host-side user annotations)."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    out = dict.fromkeys(REGIONS, 0.0)
    for event in events:
        if event.get("cat") == "user_annotation" and event.get("name") in out:
            out[event["name"]] += event.get("dur", 0) / 1000.0
    return out


def run_case(shape: str, name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from tiny_llm.config import load_recipe

    sets = [
        f"optimizer.name={name}",
        f"model.context_length={args.context}",
        f"training.batch_tokens={args.context}",
        "training.micro_batch_size=1",
        f"runtime.device={args.device}",
        f"runtime.cpu_threads={args.threads}",
        f"runtime.compile={'true' if args.device != 'cpu' else 'false'}",
        "runtime.fused_optimizer=true",
        *args.set,
    ]
    recipe = load_recipe([shape], sets)
    output = work / f"{shape}-{name}.json"
    command = [
        sys.executable, "-m", "tiny_llm", "benchmark-worker", "--config", shape,
        *[a for s in sets for a in ("--set", s)],
        "--output", str(output), "--data-mode", "synthetic", "--warmup", "1", "--steps", str(args.steps),
        "--windows", "1", "--profile",
    ]  # fmt: skip
    subprocess.run(command, check=False, capture_output=True, text=True)
    result = json.loads(output.read_text())
    if result["status"] != "ok":
        return {"status": result["status"], "error": result["error"]}
    regions = region_ms(Path(result["protocol"]["trace"]))
    return {
        "status": "ok",
        "parameters": parameter_count(recipe.model),
        "optimizer_ms": round(regions["optimizer"], 2),
        "regions_ms": {k: round(v, 2) for k, v in regions.items()},
        "seconds_per_step": round(result["seconds_per_step"], 4),
        "peak_memory_mib": round(result["peak_memory_bytes"] / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            cases[shape] = {name: run_case(shape, name, args, Path(tmp)) for name in args.optimizers}
            both = cases[shape]
            if all(both.get(n, {}).get("status") == "ok" for n in ("adamw", "muon")):
                a, m = both["adamw"], both["muon"]
                both["muon_over_adamw"] = {
                    "optimizer_ms": round(m["optimizer_ms"] / a["optimizer_ms"], 2),
                    "peak_memory": round(m["peak_memory_mib"] / a["peak_memory_mib"], 3),
                    "seconds_per_step": round(m["seconds_per_step"] / a["seconds_per_step"], 3),
                }
    setup = {"device": args.device, "threads": args.threads, "steps": args.steps, "sets": args.set}
    print(json.dumps({"setup": setup, "cases": cases}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
