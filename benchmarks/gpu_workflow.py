"""Workflow rehearsal on one GPU: the `snakemake` users run, at a small config of the full-scale kind.

The short rehearsal (the default; `benchmarks/gpu_check.sh` runs it as its `workflow` step), each step one
`snakemake` call in one working directory, one line printed per step, JSON at the end:

1. `tuning`: a short h200 tuning profile of the size `s` (one eager micro batch, no attention or compile-mode
   variants; on a GPU the tuner's CUDA-graph stage, where it has one, adds a second candidate), through to
   `results/h200-tuning/selected.yaml`;
2. `interrupt`: campaign stage 1 (one recipe, 2 seeds) taking the tuned settings, SIGTERM to the snakemake
   controller once one of its training jobs has written a train row (again every 10 s until it exits: a
   signal in Snakemake's first seconds can be lost);
3. `rerun`: the `campaign` target again, which must complete (the interrupted run resumes).

`--full` adds the rest of the rehearsal: a packed run, the `export` and `analysis` targets (the campaign's
best run), then `eval_speed` (evaluation eager vs compiled, `benchmarks/eval_speed.py`) and `peers`
(`benchmarks/peers.py`), their JSON kept in the summary.

`--timeout SECONDS` bounds the whole rehearsal: each call gets what is left, a call past it is stopped
(SIGTERM to its process group, SIGKILL 5 s later) and recorded as timed out, and the JSON is written anyway.

The data is the embedded demo corpus with its own tokenizer (the GPU machine has no network): on the GPU the
size `s` is the 20m preset at vocabulary 4,096 (~2M tokens, `training.data_passes` 4); the candidates are
eager, so the campaign's runs (which take the tuned settings) start without compiling.

Modes: `--dry-run` writes the config and runs `snakemake -n` for every step's targets (no training; CPU is
enough); `--cpu-smoke` runs every step for real at the `tiny` shape on the CPU (a CPU tuning profile).

Example:
    python benchmarks/gpu_workflow.py --workdir /tmp/gpu-workflow --output gpu-workflow.json --timeout 70
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
from snakemake_driver import REPO, snakemake_command

from tiny_llm.tuning.tuner import kill_group  # SIGTERM the group, SIGKILL what is left


def sizes(kind: str) -> dict[str, Any]:
    if kind == "cpu":
        short = {"tokens_per_parameter": 0.25, "epoch_tokens_per_parameter": 0.125}  # 32 updates, 2 epochs
        return {"s": {"preset": "tiny", "threads": 1, "mem_mb": 2000, "runtime_minutes": 10,
                      "overrides": {"training": short}}}  # fmt: skip
    # ~21M parameters at vocabulary 4,096: 0.1 tokens per parameter is ~2M tokens (64 updates) in 2 epochs
    short = {"tokens_per_parameter": 0.1, "epoch_tokens_per_parameter": 0.05, "data_passes": 4,
             "micro_batch_size": 32}  # fmt: skip
    return {"s": {"preset": "20m", "threads": 8, "mem_mb": 64000, "runtime_minutes": 30,
                  "overrides": {"model": {"vocab_size": 4096}, "training": short}}}  # fmt: skip


def tuning_profile(kind: str) -> dict[str, Any]:
    """One eager stage-1 candidate, no attention or compile-mode variants: the tuner's files, not a search."""
    if kind == "cpu":
        return {"size": "s", "space": "cpu", "budget_minutes": 2, "candidate_timeout_seconds": 90,
                "min_start_seconds": 5, "warmup": 1, "steps": 2, "windows": 2,
                "stage1": [[16, False]], "attention_variants": [], "cpu_amp_variants": [],
                "threads": []}  # fmt: skip
    return {"size": "s", "space": "gpu", "budget_minutes": 1, "candidate_timeout_seconds": 30,
            "min_start_seconds": 5, "warmup": 2, "steps": 5, "windows": 2,
            "stage1": [[32, False]], "attention_variants": [], "compile_modes": []}  # fmt: skip


def workflow_config(kind: str) -> dict[str, Any]:
    """The rehearsal's workflow config: one size `s` (20m on the GPU, tiny on the CPU), profile `h200`."""
    batch = 1024 if kind == "cpu" else 32768
    return {
        "data": {
            "corpus": "embedded",
            "validation_fraction": 0.05,
            "tokenizer": "train",
            "cache_dir": "results/data/cache",
        },  # fmt: skip
        "sizes": sizes(kind),
        "recipe_defaults": {"training": {"checkpoint_policy": "interval", "checkpoint_every": 20}},
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
                "packed4-s": {"size": "s", "preset": "packed4-20m-awc" if kind == "gpu" else "packed4-tiny"}
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


TUNING = ["results/h200-tuning/selected.yaml"]
CAMPAIGN = ["campaign"]
FULL_STEPS: list[tuple[str, list[str]]] = [
    ("packed", ["results/packed/packed4-s/result.json"]),
    ("export", ["export"]),
    ("analysis", ["analysis"]),
]


def snakemake(workdir: Path, config: Path, cores: int, gpu: bool, *extra: str) -> list[str]:
    resources = ["--resources", "gpu=1"] if gpu else []
    return snakemake_command(
        workdir, "--cores", str(cores), *resources, *extra, configfile=config, replace_config=False
    )


class Clock:
    """The rehearsal's deadline: what each call may still take."""

    def __init__(self, timeout: float | None):
        self.start = time.perf_counter()
        self.deadline = None if timeout is None else self.start + timeout

    def left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.perf_counter())


def run_step(name: str, cmd: list[str], log: Path, clock: Clock) -> dict[str, Any]:
    start = time.perf_counter()
    left = clock.left()
    timed_out = False
    if left is not None and left < 1:
        row = {"step": name, "returncode": None, "seconds": 0.0, "timed_out": True, "log": str(log)}
        print(f"{name}: SKIPPED (the rehearsal's timeout was reached)", flush=True)
        return row
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(left)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
    row = {
        "step": name,
        "returncode": proc.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "timed_out": timed_out,
        "log": str(log),
    }
    state = "TIMED OUT" if timed_out else "ok" if proc.returncode == 0 else "FAILED"
    print(f"{name}: {state} in {row['seconds']} s (log {log})", flush=True)
    return row


def bench_commands(kind: str) -> dict[str, list[str]]:
    """Evaluation eager vs compiled and the peers, at 20m on the GPU (demo-s on the CPU); --full only."""
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


def bench_step(name: str, cmd: list[str], log: Path, clock: Clock) -> dict[str, Any]:
    """A benchmark script's JSON (its stdout) as the step's result."""
    start = time.perf_counter()
    row: dict[str, Any] = {"step": name, "log": str(log), "timed_out": False}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=clock.left())
        log.write_text(done.stderr)
        row["returncode"] = done.returncode
        if done.returncode == 0:
            row["result"] = json.loads(done.stdout)
    except subprocess.TimeoutExpired:
        row.update(returncode=None, timed_out=True)
    row["seconds"] = round(time.perf_counter() - start, 1)
    print(f"{name}: {'ok' if row['returncode'] == 0 else 'FAILED'} in {row['seconds']} s", flush=True)
    return row


def campaign_train_rows(workdir: Path) -> int:
    """Train rows written so far by the campaign's runs (their metrics.jsonl files)."""
    rows = 0
    for path in (workdir / "results" / "campaign").glob("**/metrics.jsonl"):
        try:
            rows += sum('"event": "train"' in line for line in path.read_text().splitlines())
        except OSError:
            continue
    return rows


def interrupt_step(cmd: list[str], workdir: Path, logs: Path, clock: Clock) -> dict[str, Any]:
    """Start the controller, SIGTERM it once a training job has written a train row, wait until it exits."""
    start = time.perf_counter()
    left = clock.left()
    until = None if left is None else start + left
    log = logs / "rehearsal-interrupt.log"

    def in_time() -> bool:
        return until is None or time.perf_counter() < until

    signals = 0
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while proc.poll() is None and not campaign_train_rows(workdir) and in_time():
            time.sleep(0.5)
        rows_at_signal = campaign_train_rows(workdir)
        while proc.poll() is None and in_time():
            proc.send_signal(signal.SIGTERM)
            signals += 1
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                continue
        timed_out = proc.poll() is None
        if timed_out:
            kill_group(proc)
    saved = sorted(str(p.relative_to(workdir)) for p in (workdir / "results").glob("campaign/**/latest.pt"))
    row = {"step": "interrupt", "returncode": proc.returncode, "signals": signals,
           "train_rows_at_signal": rows_at_signal, "seconds": round(time.perf_counter() - start, 1),
           "timed_out": timed_out, "state_saved": saved, "log": str(log)}  # fmt: skip
    row["ok"] = proc.returncode != 0 and signals > 0 and not timed_out
    print(f"interrupt: {'ok' if row['ok'] else 'FAILED'} (exit {proc.returncode} after {signals} SIGTERM, "
          f"{rows_at_signal} train rows, states saved: {len(saved)}) in {row['seconds']} s",
          flush=True)  # fmt: skip
    return row


def resumed_runs(workdir: Path) -> list[str]:
    """Campaign runs whose last session resumed a saved state (the trainer writes environment-resume.json)."""
    runs = (workdir / "results" / "campaign").glob("**/environment-resume.json")
    return sorted(str(p.parent.relative_to(workdir)) for p in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="working directory (results/ and logs/)")
    parser.add_argument("--output", type=Path, help="JSON of the steps (default WORKDIR/gpu-workflow.json)")
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=None, help="seconds for the whole rehearsal")
    parser.add_argument(
        "--full", action="store_true", help="also packed, export, analysis, eval_speed, peers"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="snakemake -n for every step; no training")
    mode.add_argument("--cpu-smoke", action="store_true", help="every step for real at `tiny` on the CPU")
    args = parser.parse_args(argv)
    kind = "cpu" if args.cpu_smoke or args.dry_run else "gpu"
    clock = Clock(args.timeout)
    # The jobs' `python -m tiny_llm` is this interpreter's, on this checkout (as gpu_workflow.sh sets it).
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    args.workdir.mkdir(parents=True, exist_ok=True)
    logs = args.workdir / "logs"
    logs.mkdir(exist_ok=True)
    config = args.workdir / "rehearsal.yaml"
    config.write_text(
        yaml.safe_dump(workflow_config("gpu" if not args.cpu_smoke else "cpu"), sort_keys=False)
    )
    base = snakemake(args.workdir, config, args.cores, gpu=kind == "gpu")
    targets = [("tuning", TUNING), ("campaign", CAMPAIGN), *(FULL_STEPS if args.full else [])]
    rows = []
    if args.dry_run:
        for name, target in targets:
            rows.append(run_step(name, [*base, "-n", *target], logs / f"rehearsal-{name}.log", clock))
    else:
        rows.append(run_step("tuning", [*base, *TUNING], logs / "rehearsal-tuning.log", clock))
        rows.append(interrupt_step([*base, *CAMPAIGN], args.workdir, logs, clock))
        rows.append(run_step("rerun", [*base, *CAMPAIGN], logs / "rehearsal-rerun.log", clock))
        rows[-1]["resumed_runs"] = resumed_runs(args.workdir)
        for name, target in FULL_STEPS if args.full else []:
            rows.append(run_step(name, [*base, *target], logs / f"rehearsal-{name}.log", clock))
        for name, cmd in bench_commands(kind).items() if args.full else []:
            rows.append(bench_step(name, cmd, logs / f"rehearsal-{name}.log", clock))
    ok = all(r.get("ok", r["returncode"] == 0) for r in rows)
    summary = {"mode": "dry-run" if args.dry_run else kind, "workdir": str(args.workdir), "ok": ok,
               "full": args.full, "timeout_s": args.timeout,
               "seconds": round(time.perf_counter() - clock.start, 1), "steps": rows}  # fmt: skip
    output = args.output or args.workdir / "gpu-workflow.json"
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, output)
    print(f"total: {'ok' if ok else 'FAILED'} in {summary['seconds']} s; {output}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
