"""Where a workflow's time goes: each job's timing as Snakemake measured it, summed per stage.

Every rule that runs a command has a ``benchmark:`` file beside its log (``logs/<rule>/<job>.tsv``,
Snakemake's own per-job timing: the wall seconds ``s`` and the CPU seconds ``cpu_time`` of the job's
processes, sampled every 0.5 s for the first 15 s, then every 30 s, so a long job's last stretch is not
counted). A rule's stage is the rules/ file that holds it (rules/campaign.smk: campaign). The closing summary
and benchmarks/demo_time.py read them; nothing here imports Snakemake.

A job that the fork server ran (tiny_llm/runtime/forkserver.py) spends its CPU outside the processes
Snakemake samples: the server's record of it (``logs/fork-server.jsonl``, exact) is added to its job's, which
it names by the log its output went to, together with the records of the served jobs it started.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

BENCHMARK_SUFFIX = ".tsv"
"""A job's benchmark file is its log's path with this suffix instead of ``.log``."""
SERVED_JOBS = "fork-server.jsonl"
"""The fork server's record of the jobs it ran, in the logs directory (the Snakefile's onstart)."""
LONGEST_STAGES = 3
"""How many stages the closing summary names."""


@dataclass(frozen=True)
class JobTime:
    """One job's benchmark record."""

    rule: str
    job: str
    """The job's name within its rule: its log's path below logs/<rule>/, without the suffix."""
    wall_s: float
    cpu_s: float | None
    """None where Snakemake took no sample (a job of under half a second)."""
    ended: float
    """When the record was written (seconds since the epoch): the job's end."""


@dataclass(frozen=True)
class StageTime:
    """The jobs of one stage, their wall and CPU seconds summed."""

    stage: str
    num_jobs: int
    wall_s: float
    cpu_s: float


def read_job_time(path: Path, logs_dir: Path, served: dict[str, float] | None = None) -> JobTime:
    """The record of one benchmark file (the mean of its rows, where a rule repeats its job), with the CPU
    seconds the fork server spent on it (``served``, by log path below ``logs_dir``)."""
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if not rows:
        raise ValueError(f"{path}: a benchmark file without a record")
    walls = [float(row["s"]) for row in rows]
    cpus = [float(row["cpu_time"]) for row in rows if row.get("cpu_time") not in (None, "", "NA")]
    name = path.relative_to(logs_dir).as_posix().removesuffix(BENCHMARK_SUFFIX)
    rule, _, job = name.partition("/")
    cpu = sum(cpus) / len(cpus) if cpus else None
    if (extra := (served or {}).get(f"{name}.log")) is not None:
        cpu = (cpu or 0.0) + extra
    return JobTime(rule=rule, job=job, wall_s=sum(walls) / len(walls), cpu_s=cpu, ended=path.stat().st_mtime)


def job_times(logs_dir: str | Path, since: float | None = None) -> list[JobTime]:
    """Every job's record under ``logs_dir``, or only those written at or after ``since`` (this run's);
    a file that is not a readable benchmark record is skipped."""
    logs_dir = Path(logs_dir)
    served = served_cpu(logs_dir)
    jobs = []
    for path in sorted(logs_dir.glob(f"*/**/*{BENCHMARK_SUFFIX}")):
        try:
            if since is None or path.stat().st_mtime >= since:
                jobs.append(read_job_time(path, logs_dir, served))
        except (OSError, ValueError, KeyError):  # being written, or not Snakemake's
            continue
    return jobs


def served_cpu(logs_dir: Path) -> dict[str, float]:
    """CPU seconds the fork server spent on each job, by its log's path below ``logs_dir`` (of the latest
    run of that job: a rerun's record follows the earlier one). A served job that another one started (the
    tuner's timed worker, which its candidate job starts) counts for the job that started it."""
    cpu: dict[str, float] = {}
    try:
        lines = (logs_dir / SERVED_JOBS).read_text(encoding="utf-8").splitlines()
    except OSError:
        return cpu
    root = logs_dir.resolve()
    # a running served job -> the one it counts for (itself, or the one its starter counts for); and the CPU
    # of ended jobs that a running one started, by the one they count for
    owner: dict[int, int] = {}
    nested: dict[int, float] = {}
    for line in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
            record = json.loads(line)
            if "started" in record:
                pid = int(record["started"])
                owner[pid] = owner.get(record.get("parent"), pid)
                continue
            pid, seconds = int(record["pid"]), float(record["cpu_s"])
            if (counts_for := owner.pop(pid, pid)) != pid:
                nested[counts_for] = nested.get(counts_for, 0.0) + seconds
                continue
            seconds += nested.pop(pid, 0.0)
            log = Path(record["log"])
            if log.is_relative_to(root):
                cpu[log.relative_to(root).as_posix()] = seconds
    return cpu


def rule_stages(rules_dir: str | Path) -> dict[str, str]:
    """Rule name -> its stage, the name of the rules/ file that defines it."""
    stages = {}
    for path in sorted(Path(rules_dir).glob("*.smk")):
        for name in re.findall(r"^(?:rule|checkpoint) (\w+):", path.read_text(encoding="utf-8"), re.M):
            stages[name] = path.stem
    return stages


def stage_times(jobs: Iterable[JobTime], stages: dict[str, str]) -> list[StageTime]:
    """Per stage, its jobs' summed wall and CPU seconds, the longest first (a rule no rules/ file defines is
    its own stage)."""
    totals: dict[str, list[float]] = {}
    for job in jobs:
        total = totals.setdefault(stages.get(job.rule, job.rule), [0, 0.0, 0.0])
        total[0] += 1
        total[1] += job.wall_s
        total[2] += job.cpu_s or 0.0
    summed = [StageTime(stage, int(n), wall, cpu) for stage, (n, wall, cpu) in totals.items()]
    return sorted(summed, key=lambda s: (-s.wall_s, s.stage))


def format_seconds(seconds: float) -> str:
    """``45 s``, ``7 min 02 s``, ``1 h 03 min``."""
    whole = max(0, math.floor(seconds + 0.5))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole // 60 % 60:02d} min"


def time_lines(total_s: float, stages: list[StageTime], top: int = LONGEST_STAGES) -> list[str]:
    """The closing summary's lines on time: the run's wall time and its ``top`` longest stages."""
    lines = [f"Time: {format_seconds(total_s)} in all."]
    if stages:
        longest = ", ".join(
            f"{s.stage} {format_seconds(s.wall_s)} in {s.num_jobs} job{'s' * (s.num_jobs != 1)}"
            for s in stages[:top]
        )
        lines.append(f"Longest stages (their jobs' wall time summed): {longest}; per job: logs/<rule>/*.tsv")
    return lines


def closing_time_lines(started: datetime, workflow_dir: str | Path, logs_dir: str = "logs") -> list[str]:
    """The time lines of a controller that started at ``started`` (local time, as Snakemake's own): its jobs
    are those whose benchmark records it wrote; the stages are the rules/ files of ``workflow_dir``."""
    since = started.timestamp()
    stages = stage_times(job_times(logs_dir, since=since), rule_stages(Path(workflow_dir) / "rules"))
    return time_lines(time.time() - since, stages)
