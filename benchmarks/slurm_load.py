"""The controller's cost under load: N small training jobs submitted at once through profiles/slurm.

    python benchmarks/slurm_load.py --workdir /tmp/slurm-load --jobs 50

N plain runs of the `tiny` preset on a few updates each (the data stage runs first, locally), every one
its own sbatch job, all ready at once. The controller runs with `sacct`, `squeue` and `sbatch` on its PATH
replaced by shims that count each call; its CPU time is user + system, its waited-for children included
(sbatch, squeue, the localrules). Prints one JSON object: jobs, wall seconds, controller CPU seconds (and per
job), squeue / sacct / sbatch calls (and status queries per job).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from faults_slurm import slurm_profile
from snakemake_driver import claim_workdir, snakemake_command


def workflow_config(num_jobs: int) -> dict:
    size = {"preset": "tiny", "threads": 1, "mem_mb": 500, "runtime_minutes": 10}
    budget = {"training": {"tokens_per_parameter": 0.05, "epoch_tokens_per_parameter": 0.05}}
    return {
        "data": {"corpus": "embedded", "validation_fraction": 0.05, "tokenizer": "train"},
        "sizes": {"tiny": {**size, "overrides": budget}},
        "recipe_defaults": {"training": {"checkpoint_policy": "final"}},
        "runs": {
            f"load-{i:03d}": {"size": "tiny", "overrides": {"runtime": {"seed": i}}} for i in range(num_jobs)
        },
    }


def shims(directory: Path) -> Path:
    """sacct, squeue and sbatch that append their name to calls.log, then run the real command."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "calls.log").write_text("")
    for name in ("sacct", "squeue", "sbatch"):
        real = shutil.which(name)
        if real is None:
            sys.exit(f"{name} not found: this benchmark needs a Slurm cluster (../shared/slurm-local)")
        shim = directory / name
        shim.write_text(f'#!/bin/sh\necho {name} >> "{directory / "calls.log"}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)
    return directory


def snakemake(workdir: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    command = snakemake_command(workdir, *args, configfile=workdir / "config.yaml")
    log = open(workdir / "controller.log", "a")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir", type=Path, required=True, help="scratch directory, new or an earlier one (emptied first)"
    )
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    workdir = claim_workdir(args.workdir, empty=True)
    (workdir / "config.yaml").write_text(yaml.safe_dump(workflow_config(args.jobs), sort_keys=False))
    if snakemake(workdir, "--cores", "2", "data").wait():
        sys.exit(f"data stage failed; see {workdir / 'controller.log'}")
    targets = [f"results/runs/load-{i:03d}/result.json" for i in range(args.jobs)]
    path = shims(workdir / "shims")
    env = {**os.environ, "PATH": f"{path}{os.pathsep}{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = snakemake(workdir, "--workflow-profile", str(slurm_profile(workdir)), *targets, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    calls = (path / "calls.log").read_text().split()
    cpu = usage.ru_utime + usage.ru_stime
    done = sum((workdir / target).is_file() for target in targets)
    report = {
        "jobs": args.jobs,
        "completed": done,
        "returncode": proc.returncode,
        "wall_seconds": round(wall, 1),
        "controller_cpu_seconds": round(cpu, 1),
        "controller_cpu_seconds_per_job": round(cpu / args.jobs, 2),
        "controller_max_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "calls": {name: calls.count(name) for name in ("squeue", "sacct", "sbatch")},
        "status_queries_per_job": round((calls.count("squeue") + calls.count("sacct")) / args.jobs, 2),
        "self_cpu_seconds": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
    }
    print(json.dumps(report, indent=2))
    return 0 if proc.returncode == 0 and done == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
