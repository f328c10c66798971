"""Wall time of the recipe campaign (target `campaign`) from scratch, printed as JSON.

    python benchmarks/campaign.py --workdir DIR [--configfile workflow_config.yaml] [--cores 2]

Runs the repository's Snakefile in DIR (the repository's own results/ are not touched): the data stage, then
the campaign. Reports the wall time of each phase, of every job by rule (from Snakemake's metadata), and for
every training run its tokens, training seconds, whole-session seconds and final validation loss, plus the
campaign's own GPU-hour estimate.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from snakemake_driver import REPO, snakemake_command

from tiny_llm.io import read_json


def snakemake(workdir: Path, configfile: Path, cores: int, target: str) -> float:
    cmd = snakemake_command(workdir, "--cores", str(cores), target, configfile=configfile)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"snakemake {target} failed:\n{proc.stderr[-4000:]}")
    return time.perf_counter() - start


def job_times(workdir: Path) -> dict[str, dict[str, float]]:
    """Rule -> count / total / median job wall seconds, from .snakemake/metadata."""
    jobs: dict[tuple[str, object, float], float] = {}  # one record per output file: one entry per job
    for record in (workdir / ".snakemake" / "metadata").iterdir():
        meta = read_json(record)
        path = base64.urlsafe_b64decode(record.name.encode() + b"==").decode(errors="replace")
        if meta.get("starttime") and meta.get("endtime") and "campaign" in path:
            key = (meta["rule"], meta.get("job_hash"), meta["endtime"])
            jobs[key] = max(jobs.get(key, 0.0), meta["endtime"] - meta["starttime"])
    per_rule: dict[str, list[float]] = {}
    for (rule, _, _), seconds in jobs.items():
        per_rule.setdefault(rule, []).append(seconds)
    return {
        rule: {
            "jobs": len(v),
            "total_seconds": round(sum(v), 2),
            "median_seconds": round(statistics.median(v), 2),
        }
        for rule, v in sorted(per_rule.items())
    }


def run_rows(root: Path) -> list[dict]:
    rows = []
    for result_file in sorted(root.glob("stage*/*/result.json")):
        result = read_json(result_file)
        rows.append(
            {
                "run": result_file.parent.name,
                "stage": result_file.parent.parent.name,
                "tokens": result["tokens"],
                "training_seconds": round(result["training_seconds"], 2),
                "seconds_this_session": round(result["seconds_this_session"], 2),
                "training_tokens_per_second": round(result["training_tokens_per_second"], 1),
                "final_loss": result["final_validation"]["loss"],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, type=Path, help="empty scratch working directory")
    parser.add_argument("--configfile", type=Path, default=REPO / "workflow_config.yaml")
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data_seconds = snakemake(args.workdir, args.configfile.resolve(), args.cores, "data")
    campaign_seconds = snakemake(args.workdir, args.configfile.resolve(), args.cores, "campaign")
    root = args.workdir / "results" / "campaign"
    plan = read_json(root / "campaign.json")
    print(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "cores": args.cores,
                "data_stage_seconds": round(data_seconds, 1),
                "campaign_seconds": round(campaign_seconds, 1),
                "jobs": job_times(args.workdir),
                "runs": run_rows(root),
                "gpu_hour_estimate": plan["gpu_hour_estimate"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
