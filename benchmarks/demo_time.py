"""Where a finished workflow directory's time went, per stage, printed as JSON.

    python benchmarks/demo_time.py DIR   # DIR: a finished demo (benchmarks/workflow.py demo --workdir DIR)

Reads every job's benchmark file (``DIR/logs/<rule>/<job>.tsv``, Snakemake's own per-job timing) and sums
their wall and CPU seconds per stage, the rules/ file of each job's rule (tiny_llm/pipeline/timing.py), and
per rule. The CPU seconds are Snakemake's samples of each job's processes (every 0.5 s for the first 15 s,
then every 30 s): a lower bound for jobs longer than 15 s; benchmarks/workflow.py measures the whole run's CPU
exactly. The total wall time is the run's controller log's (``.snakemake/log/<start>.snakemake.log``, from
its name's time to its last write), and the span of the jobs (first job's start to last job's end) beside it.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path

from snakemake_driver import REPO

from tiny_llm.pipeline.timing import StageTime, job_times, rule_stages, stage_times

CONTROLLER_LOG_TIME = "%Y-%m-%dT%H%M%S.%f"
"""The start time in a controller log's name (``2026-12-04T175226.585881.snakemake.log``)."""


def controller_wall(workdir: Path, first_job_start: float) -> dict:
    """The controller log of the run whose jobs these are (the last one that started before the first job):
    when it started, and its wall seconds to its last write."""
    logs = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    starts = {
        log: datetime.strptime(log.name.removesuffix(".snakemake.log"), CONTROLLER_LOG_TIME) for log in logs
    }
    before = [log for log in logs if starts[log].timestamp() <= first_job_start]
    if not before:
        return {}
    log, started = before[-1], starts[before[-1]]
    return {
        "controller_log": str(log.relative_to(workdir)),
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(log.stat().st_mtime - started.timestamp(), 1),
    }


def demo_time(workdir: Path) -> dict:
    jobs = job_times(workdir / "logs")
    if not jobs:
        raise SystemExit(
            f"error: {workdir}/logs holds no benchmark files (logs/<rule>/*.tsv); run the workflow"
        )
    stages = stage_times(jobs, rule_stages(REPO / "rules"))
    first_start = min(j.ended - j.wall_s for j in jobs)
    return {
        "benchmark": "per-stage time of a finished workflow directory (Snakemake's per-job benchmark files)",
        "workdir": str(workdir),
        "controller": controller_wall(workdir, first_start),
        "jobs_span_s": round(max(j.ended for j in jobs) - first_start, 1),
        "jobs": len(jobs),
        "job_wall_s": round(sum(s.wall_s for s in stages), 1),
        "job_cpu_s_sampled": round(sum(s.cpu_s for s in stages), 1),
        "stages": [summed(s) for s in stages],
        "rules": [summed(s) for s in stage_times(jobs, {})],  # each rule its own "stage"
    }


def summed(stage: StageTime) -> dict:
    return {
        "name": stage.stage,
        "jobs": stage.num_jobs,
        "wall_s": round(stage.wall_s, 1),
        "cpu_s": round(stage.cpu_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workdir", type=Path, help="a finished workflow directory (holds logs/ and .snakemake/)"
    )
    print(json.dumps(demo_time(parser.parse_args().workdir.resolve()), indent=2))


if __name__ == "__main__":
    main()
