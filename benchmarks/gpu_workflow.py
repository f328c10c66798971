"""Workflow rehearsal on one GPU: the `snakemake` users run, at a small config of the full-scale kind.

Steps, each one `snakemake` call in one working directory (one line printed per step, JSON at the end):

1. `tuning`: a short h200 tuning profile of the 20m size, through to `results/h200-tuning/selected.yaml`;
2. `campaign`: campaign stage 1 at a few million tokens (one recipe, 2 seeds), taking the tuned settings;
3. `packed`: a packed 20m run (`results/packed/packed4-20m/result.json`);
4. `export`: the campaign's best 20m run exported (`export` target);
5. `analysis`: the second-order analysis of that run at its final state (`analysis` target, small S and R);
Between steps 3 and 4 (export would train it otherwise):
`interrupt`: a plain 20m run started, SIGTERM to the snakemake controller once its training job has started
(again every 10 s until it exits: a signal in Snakemake's first seconds can be lost); `rerun`: the same target
again, which must complete.
Then `eval_speed` (evaluation eager vs compiled at 20m, `benchmarks/eval_speed.py`) and `peers`
(`benchmarks/peers.py` at 20m, 32,768-token updates), their JSON kept in the summary.

The data is the embedded demo corpus with its own 4,096-token tokenizer (the GPU machine has no network), so
the 20m model runs with vocabulary 4,096 and repeats its data (`training.data_passes`).

Modes: `--dry-run` writes the config and runs `snakemake -n` for every step's targets (no training; CPU is
enough); `--cpu-smoke` runs every step for real at the demo-s size on the CPU (a CPU tuning profile, no GPU).

Example:
    python benchmarks/gpu_workflow.py --workdir /tmp/gpu-workflow --output gpu-workflow.json
    python benchmarks/gpu_workflow.py --workdir /tmp/gpu-workflow --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def sizes(kind: str) -> dict[str, Any]:
    if kind == "cpu":
        short = {"tokens_per_parameter": 0.5, "epoch_tokens_per_parameter": 0.25}
        return {"s": {"preset": "demo-s", "threads": 1, "mem_mb": 2000, "runtime_minutes": 10,
                      "overrides": {"training": short}}}  # fmt: skip
    # ~21M parameters at vocabulary 4,096: 0.15 tokens per parameter is ~3M tokens in 2 epochs
    short = {"tokens_per_parameter": 0.15, "epoch_tokens_per_parameter": 0.075, "data_passes": 4,
             "micro_batch_size": 32}  # fmt: skip
    return {"s": {"preset": "20m", "threads": 8, "mem_mb": 64000, "runtime_minutes": 30,
                  "overrides": {"model": {"vocab_size": 4096}, "training": short}}}  # fmt: skip


def tuning_profile(kind: str) -> dict[str, Any]:
    if kind == "cpu":
        return {"size": "s", "space": "cpu", "budget_minutes": 2, "candidate_timeout_seconds": 90,
                "min_start_seconds": 10, "warmup": 1, "steps": 2, "windows": 2,
                "stage1": [[8, False], [16, False]], "threads": [1]}  # fmt: skip
    return {"size": "s", "space": "gpu", "require_gpu_name": "NVIDIA H200", "budget_minutes": 3,
            "candidate_timeout_seconds": 120, "min_start_seconds": 20, "warmup": 5, "steps": 10, "windows": 2,
            "stage1": [[8, True], [16, True], [32, True]]}  # fmt: skip


def workflow_config(kind: str) -> dict[str, Any]:
    """The rehearsal's workflow config: one size `s` (20m on the GPU, demo-s on the CPU), profile `h200`."""
    batch = 4096 if kind == "cpu" else 32768
    return {
        "data": {
            "corpus": "embedded",
            "validation_fraction": 0.05,
            "tokenizer": "train",
            "cache_dir": "results/data/cache",
        },  # fmt: skip
        "sizes": sizes(kind),
        "recipe_defaults": {"training": {"checkpoint_policy": "interval", "checkpoint_every": 20}},
        "runs": {"s-plain": {"size": "s", "overrides": {"training": {"batch_tokens": batch}}}},
        "campaign": {
            "enabled": False,
            "stages": [
                {"size": "s", "lr": [1.0e-3], "weight_decay": [0.1], "beta2": [0.95], "seeds": [42, 43]}
            ],
            "batch_tokens": {"s": batch},
            "tuning": {"s": "h200"},
        },
        "tuning": {
            "default_profiles": [],
            "profiles": {
                "h200": {**tuning_profile(kind), "overrides": {"training": {"batch_tokens": batch}}}
            },
        },
        "packed": {
            "runs": {
                "packed4-s": {"size": "s", "preset": "packed4-20m-awc" if kind == "gpu" else "packed4-demo"}
            }
        },  # fmt: skip
        "export": {"prompts": ["The history of the city"], "sampling": {"max_new_tokens": 16, "seed": 0}},
        "analysis": {
            "runs": ["campaign:best-s"],
            "checkpoints": ["final"],
            "noise_samples": 2,
            "random_samples": 2,
        },  # fmt: skip
    }


STEPS: list[tuple[str, list[str]]] = [
    ("tuning", ["results/h200-tuning/selected.yaml"]),
    ("campaign", ["campaign"]),
    ("packed", ["results/packed/packed4-s/result.json"]),
    ("export", ["export"]),
    ("analysis", ["analysis"]),
]
INTERRUPTED_TARGET = ["results/runs/s-plain/result.json"]


def snakemake(workdir: Path, config: Path, cores: int, gpu: bool, *extra: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
    ]
    cmd += ["--configfile", str(config), "--cores", str(cores)]
    return cmd + (["--resources", "gpu=1"] if gpu else []) + list(extra)


def run_step(name: str, cmd: list[str], log: Path) -> dict[str, Any]:
    start = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    row = {
        "step": name,
        "returncode": code,
        "seconds": round(time.perf_counter() - start, 1),
        "log": str(log),
    }
    print(f"{name}: {'ok' if code == 0 else 'FAILED'} in {row['seconds']} s (log {log})", flush=True)
    return row


def bench_commands(kind: str) -> dict[str, list[str]]:
    """Evaluation eager vs compiled and the peers, at 20m on the GPU (demo-s on the CPU)."""
    if kind == "cpu":
        shape = [
            "--config",
            "demo-s",
            "--set",
            "runtime.compile=true",
            "--set",
            "runtime.fused_optimizer=true",
        ]
        evaluation = ["--batches", "2", "--trials", "3"]
        peers = ["--warmup", "2", "--steps", "2", "--windows", "2"]
    else:
        shape = ["--config", "20m", "--set", "runtime.device=cuda", "--set", "training.batch_tokens=32768",
                 "--set", "training.micro_batch_size=32", "--threads", "8"]  # fmt: skip
        evaluation = ["--batches", "4", "--trials", "5"]
        peers = ["--warmup", "5", "--steps", "10", "--windows", "3"]
    py = [sys.executable]
    return {
        "eval_speed": [*py, str(REPO / "benchmarks" / "eval_speed.py"), *shape, *evaluation],
        "peers": [*py, str(REPO / "benchmarks" / "peers.py"), *shape, *peers],
    }


def bench_step(name: str, cmd: list[str], log: Path) -> dict[str, Any]:
    """A benchmark script's JSON (its stdout) as the step's result."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log.write_text(done.stderr)
    row: dict[str, Any] = {"step": name, "returncode": done.returncode, "log": str(log)}
    row["seconds"] = round(time.perf_counter() - start, 1)
    if done.returncode == 0:
        row["result"] = json.loads(done.stdout)
    print(f"{name}: {'ok' if done.returncode == 0 else 'FAILED'} in {row['seconds']} s", flush=True)
    return row


def interrupt_step(cmd: list[str], workdir: Path, logs: Path, timeout: float) -> dict[str, Any]:
    """Start the controller, SIGTERM it once the training job's log exists, wait until it exits."""
    start = time.perf_counter()
    started = workdir / "logs" / "train_run"
    log = logs / "rehearsal-interrupt.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        while (
            proc.poll() is None and not any(started.glob("*.log")) and time.perf_counter() - start < timeout
        ):
            time.sleep(1)
        time.sleep(5)  # a few updates into the job
        signals = 0
        while proc.poll() is None and time.perf_counter() - start < timeout:
            proc.send_signal(signal.SIGTERM)
            signals += 1
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    state = next(iter((workdir / "results" / "runs" / "s-plain").glob("latest.pt")), None)
    row = {"step": "interrupt", "returncode": proc.returncode, "signals": signals,
           "seconds": round(time.perf_counter() - start, 1), "state_saved": state is not None,
           "log": str(log)}  # fmt: skip
    ok = proc.returncode != 0 and signals > 0
    print(f"interrupt: {'ok' if ok else 'FAILED'} (exit {proc.returncode} after {signals} SIGTERM, "
          f"state saved: {state is not None}) in {row['seconds']} s", flush=True)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="working directory (results/ and logs/)")
    parser.add_argument("--output", type=Path, help="JSON of the steps (default WORKDIR/gpu-workflow.json)")
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument(
        "--step-timeout", type=float, default=600, help="seconds before the interrupt gives up"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="snakemake -n for every step; no training")
    mode.add_argument("--cpu-smoke", action="store_true", help="every step for real at demo-s on the CPU")
    args = parser.parse_args(argv)
    kind = "cpu" if args.cpu_smoke or args.dry_run else "gpu"
    args.workdir.mkdir(parents=True, exist_ok=True)
    logs = args.workdir / "logs"
    logs.mkdir(exist_ok=True)
    config = args.workdir / "rehearsal.yaml"
    config.write_text(
        yaml.safe_dump(workflow_config("gpu" if not args.cpu_smoke else "cpu"), sort_keys=False)
    )
    base = snakemake(args.workdir, config, args.cores, gpu=kind == "gpu")
    rows = []
    if args.dry_run:
        for name, targets in [*STEPS, ("plain", INTERRUPTED_TARGET)]:
            rows.append(run_step(name, [*base, "-n", *targets], logs / f"rehearsal-{name}.log"))
    for name, targets in STEPS if not args.dry_run else []:
        if name == "export":  # the plain run is interrupted and rerun first: export would train it
            rows.append(interrupt_step([*base, *INTERRUPTED_TARGET], args.workdir, logs, args.step_timeout))
            rows.append(run_step("rerun", [*base, *INTERRUPTED_TARGET], logs / "rehearsal-rerun.log"))
        rows.append(run_step(name, [*base, *targets], logs / f"rehearsal-{name}.log"))
    for name, cmd in bench_commands(kind).items() if not args.dry_run else []:
        rows.append(bench_step(name, cmd, logs / f"rehearsal-{name}.log"))
    ok = all(r["returncode"] == 0 for r in rows if r["step"] != "interrupt")
    summary = {"mode": "dry-run" if args.dry_run else kind, "workdir": str(args.workdir), "ok": ok,
               "seconds": round(sum(r["seconds"] for r in rows), 1), "steps": rows}  # fmt: skip
    output = args.output or args.workdir / "gpu-workflow.json"
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, output)
    print(f"total: {'ok' if ok else 'FAILED'} in {summary['seconds']} s; {output}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
