"""Workflow timings, printed as JSON.

    python benchmarks/workflow.py dry-run [--repeat 5]     # `snakemake -n` of the full default DAG
    python benchmarks/workflow.py demo --workdir DIR       # the embedded demo (default target) from scratch

Both run the repository's Snakefile with workflow_config.yaml in a scratch working directory, so the
repository's own results/ are neither used nor touched. `demo` also reports the wall time of every job, read
from Snakemake's metadata.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from snakemake_driver import REPO, snakemake_command

from tiny_llm.io import read_json


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    return snakemake_command(workdir, *args, configfile=REPO / "workflow_config.yaml")


def dry_run(repeat: int) -> dict:
    seconds, cpu, jobs = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            wall, used, proc = timed(snakemake_cmd(Path(tmp), "-n"))
            seconds.append(wall)
            cpu.append(used)
            match = re.search(r"^total\s+(\d+)$", proc.stdout, re.MULTILINE)
            jobs = int(match.group(1)) if match else None
        startup_wall, startup_cpu, _ = timed([sys.executable, "-m", "snakemake", "--version"])
    return {
        "benchmark": "snakemake -n (full default DAG)",
        "jobs": jobs,
        "seconds": [round(s, 3) for s in seconds],
        "median_seconds": round(statistics.median(seconds), 3),
        "median_cpu_seconds": round(statistics.median(cpu), 3),
        "snakemake_version_seconds": round(startup_wall, 3),
        "snakemake_version_cpu_seconds": round(startup_cpu, 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds, CPU seconds (user + sys of the child and everything it waited for) and the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def job_times(workdir: Path) -> list[dict]:
    """(rule, first output, seconds) of every job, from .snakemake/metadata (one record per output file)."""
    rows = {}
    for path in sorted((workdir / ".snakemake" / "metadata").glob("*")):
        try:
            record = read_json(path)
            output = base64.b64decode(path.name.replace("@", "/")).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if record.get("starttime") and record.get("endtime"):
            seconds = round(record["endtime"] - record["starttime"], 2)
            row = {"rule": record["rule"], "output": output, "seconds": seconds}
            rows.setdefault(record["job_hash"], row)
    return sorted(rows.values(), key=lambda row: -row["seconds"])


def demo(workdir: Path, cores: str, shared_startup: bool) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        raise SystemExit(f"{workdir} is not empty; the demo benchmark starts from scratch")
    startup = [] if shared_startup else ["--config", "shared_startup=False"]  # every job its own process
    try:
        wall, used, _ = timed(snakemake_cmd(workdir, "--cores", cores, *startup))
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stderr[-4000:])
        raise SystemExit(f"demo failed (exit {exc.returncode})") from None
    return {
        "benchmark": "embedded demo, default target, from scratch",
        "cores": cores,
        "shared_startup": shared_startup,
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(used, 1),
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "jobs": job_times(workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    dry = sub.add_parser("dry-run")
    dry.add_argument("--repeat", type=int, default=5)
    full = sub.add_parser("demo")
    full.add_argument("--workdir", type=Path, required=True)
    full.add_argument("--cores", default="all")
    full.add_argument(
        "--no-shared-startup",
        dest="shared_startup",
        action="store_false",
        help="start every job as its own process (the config's shared_startup: false)",
    )
    args = parser.parse_args()
    if args.what == "dry-run":
        result = dry_run(args.repeat)
    else:
        result = demo(args.workdir, args.cores, args.shared_startup)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
