"""Per-job timing (tiny_llm/pipeline/timing.py): every rule that runs a command has a benchmark file beside
its log, and the closing summary sums them per stage."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path

import pytest
from pipeline_helpers import REPO

from tiny_llm.pipeline.timing import (
    JobTime,
    closing_time_lines,
    format_seconds,
    job_times,
    rule_stages,
    stage_times,
    time_lines,
)

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
"""The header of Snakemake 9's benchmark files."""


def record(wall: float, cpu: float | str) -> str:
    """One row as Snakemake writes it (cpu NA: the job ended before the first sample)."""
    return f"{wall}\t0:00:{int(wall):02d}\t373.13\t1055.23\t268.50\t292.65\t0.01\t36.17\t22.75\t{cpu}\n"


def write(path: Path, text: str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def rule_blocks() -> dict[str, str]:
    """Rule name -> its text, for every rule of rules/*.smk."""
    blocks = {}
    for path in sorted((REPO / "rules").glob("*.smk")):
        parts = re.split(r"^(?:rule|checkpoint) (\w+):\n", path.read_text(encoding="utf-8"), flags=re.M)
        blocks.update(dict(zip(parts[1::2], parts[2::2], strict=True)))
    return blocks


def test_every_rule_that_runs_a_command_has_a_benchmark_file_beside_its_log() -> None:
    blocks = rule_blocks()
    commands = {name: text for name, text in blocks.items() if "\n    shell:\n" in text}
    assert len(commands) >= 30
    for name, text in commands.items():
        log = re.search(r'\n    log:\n        "(logs/[^"]+)\.log",?\n', text)
        benchmark = re.search(r'\n    benchmark:\n        "([^"]+)",?\n', text)
        assert log and benchmark, f"rule {name}: a log and a benchmark file, one line each"
        assert benchmark.group(1) == f"{log.group(1)}.tsv", name
    # plan files are written in a thread of the controller in milliseconds: Snakemake would time all of it
    assert all("benchmark:" not in text for name, text in blocks.items() if name not in commands)


def test_a_rules_stage_is_the_file_that_defines_it() -> None:
    stages = rule_stages(REPO / "rules")
    assert stages["train_run"] == "runs" and stages["train_campaign"] == "campaign"
    assert stages["prepare_cache"] == "data" and stages["bench_candidate"] == "tuning"
    assert set(stages) == set(rule_blocks())


def test_job_times_reads_snakemakes_records_and_keeps_those_of_this_run(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write(logs / "train_run" / "demo-s.tsv", HEADER + record(21.89, 5.16), mtime=1_000)
    write(logs / "train_campaign" / "stage1" / "r1.tsv", HEADER + record(10, 8) + record(12, 10), mtime=2_000)
    write(logs / "plot_curves" / "runs.tsv", HEADER + record(0.4, "NA"), mtime=2_000)
    write(logs / "train_run" / "demo-s.log", "not a record", mtime=2_000)
    write(logs / "report_noise" / "noise.tsv", "", mtime=2_000)  # being written: skipped
    jobs = {(j.rule, j.job): j for j in job_times(logs)}
    assert set(jobs) == {("train_run", "demo-s"), ("train_campaign", "stage1/r1"), ("plot_curves", "runs")}
    assert jobs["train_run", "demo-s"] == JobTime("train_run", "demo-s", 21.89, 5.16, 1_000)
    assert (jobs["train_campaign", "stage1/r1"].wall_s, jobs["train_campaign", "stage1/r1"].cpu_s) == (11, 9)
    assert jobs["plot_curves", "runs"].cpu_s is None
    assert {j.rule for j in job_times(logs, since=1_500)} == {"train_campaign", "plot_curves"}


def test_a_job_the_fork_server_ran_counts_the_cpu_of_the_servers_record(tmp_path: Path) -> None:
    """Snakemake samples the client's processes only; the fork server's record holds the job's own CPU."""
    logs = tmp_path / "logs"
    write(logs / "train_run" / "demo-s.tsv", HEADER + record(21.89, 0.2))
    write(logs / "plot_curves" / "runs.tsv", HEADER + record(0.4, "NA"))
    write(logs / "evaluate_run" / "demo-s.tsv", HEADER + record(3.0, 0.1))
    served = [
        {"started": 11, "client": 10, "log": str(logs / "train_run" / "demo-s.log")},
        {"pid": 9, "log": str(logs / "train_run" / "demo-s.log"), "signal": 9, "cpu_s": 4.0},  # killed, rerun
        {"pid": 11, "log": str(logs / "train_run" / "demo-s.log"), "exit": 0, "cpu_s": 20.5},
        {"pid": 12, "log": str(logs / "plot_curves" / "runs.log"), "exit": 0, "cpu_s": 0.3},
        {"pid": 13, "log": "pipe:[1234]", "exit": 0, "cpu_s": 7.0},  # not a job's log: no job's
        {"refused": "a connection from uid 65534 with 4 descriptors"},
    ]
    write(logs / "fork-server.jsonl", "".join(json.dumps(line) + "\n" for line in served) + '{"pid": 1')
    cpu = {j.rule: j.cpu_s for j in job_times(logs)}
    assert cpu == {"train_run": pytest.approx(20.7), "plot_curves": 0.3, "evaluate_run": 0.1}


def test_a_served_job_that_a_served_job_started_counts_for_that_one(tmp_path: Path) -> None:
    """The tuner's candidate job starts its timed worker, which the server forks too: the worker writes to a
    results/ file and its client's parent is the candidate job, whose CPU it counts in."""
    logs = tmp_path / "logs"
    write(logs / "bench_candidate" / "cpu-s1.tsv", HEADER + record(3.0, 0.1))
    candidate, worker = str(logs / "bench_candidate" / "cpu-s1.log"), str(tmp_path / "results" / "s1.log")
    served = [
        {"started": 20, "client": 19, "parent": 18, "log": candidate},
        {"started": 22, "client": 21, "parent": 20, "log": worker},
        {"started": 24, "client": 23, "parent": 22, "log": worker},  # and what that one started
        {"pid": 24, "log": worker, "exit": 0, "cpu_s": 1.0},
        {"pid": 22, "log": worker, "exit": 0, "cpu_s": 2.5},
        {"pid": 20, "log": candidate, "exit": 0, "cpu_s": 0.25},
        {
            "started": 22,
            "client": 30,
            "parent": 1,
            "log": candidate,
        },  # a later job with a reused pid: its own
        {"pid": 22, "log": candidate, "exit": 0, "cpu_s": 0.5},
    ]
    write(logs / "fork-server.jsonl", "".join(json.dumps(line) + "\n" for line in served))
    assert [j.cpu_s for j in job_times(logs)] == [pytest.approx(0.1 + 0.5)]  # the latest run of the job
    served = served[:6]
    write(logs / "fork-server.jsonl", "".join(json.dumps(line) + "\n" for line in served))
    assert [j.cpu_s for j in job_times(logs)] == [pytest.approx(0.1 + 0.25 + 2.5 + 1.0)]


def test_stages_sum_their_jobs_and_come_longest_first() -> None:
    jobs = [
        JobTime("train_run", "a", 30, 50, 0),
        JobTime("evaluate_run", "a", 5, None, 0),
        JobTime("train_campaign", "stage1/x", 20, 30, 0),
        JobTime("train_campaign", "stage1/y", 20, 25, 0),
        JobTime("mystery", "z", 1, 1, 0),
    ]
    stages = {"train_run": "runs", "evaluate_run": "runs", "train_campaign": "campaign"}
    summed = stage_times(jobs, stages)
    assert [(s.stage, s.num_jobs, s.wall_s, s.cpu_s) for s in summed] == [
        ("campaign", 2, 40, 55),
        ("runs", 2, 35, 50),
        ("mystery", 1, 1, 1),
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (44.6, "45 s"),
        (59.4, "59 s"),
        (59.6, "1 min 00 s"),
        (452, "7 min 32 s"),
        (3780, "1 h 03 min"),
    ],
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_time_lines_name_the_total_and_the_three_longest_stages() -> None:
    jobs = [JobTime(rule, "j", wall, None, 0) for rule, wall in [("a", 100), ("b", 90), ("c", 80), ("d", 70)]]
    lines = time_lines(452, stage_times(jobs + [JobTime("a", "k", 1, None, 0)], {}))
    assert lines[0] == "Time: 7 min 32 s in all."
    assert "a 1 min 41 s in 2 jobs, b 1 min 30 s in 1 job, c 1 min 20 s in 1 job;" in lines[1]
    assert " d " not in lines[1]
    assert time_lines(3, []) == ["Time: 3 s in all."]


def test_closing_time_lines_count_the_jobs_since_the_controller_started(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    started = datetime.now()
    write(Path("logs/train_run/old.tsv"), HEADER + record(500, 400), mtime=started.timestamp() - 60)
    write(Path("logs/train_run/new.tsv"), HEADER + record(7, 6))
    lines = closing_time_lines(started, REPO)
    assert lines[0].startswith("Time: ") and "runs 7 s in 1 job;" in lines[1]
