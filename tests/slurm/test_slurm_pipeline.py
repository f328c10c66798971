"""The workflow through a real Slurm cluster with profiles/slurm (snakemake --executor slurm).

One scratch directory laid out like the repository root (the demo's workflow_config.yaml included, as where
users launch) runs the tiny pipeline cache -> train -> report:

- Ctrl-C to the controller mid-training cancels the Slurm job; the trainer, sent SIGTERM by Slurm, saves its
  state; rerunning the same command resumes the run and finishes the pipeline, every job but the local report
  through sbatch;
- the sbatch call of a GPU training job carries the GPU request, account, partition, time and memory, and the
  retry after a failed submission doubles the time.

Budget: about 2.5 min on the CI box (each Slurm job costs seconds of start-up plus the plugin's polling).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from slurm_helpers import (
    REPO,
    REQUIRE_ENV,
    Cluster,
    SubmittedJob,
    derive_profile,
    detect_cluster,
    interrupt,
    queued,
    run_snakemake,
    sacct_states,
    start_snakemake,
    submitted_jobs,
    unavailable_reason,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPORT = "results/report/runs/report.md"
RUN_DIR = "results/runs/tiny-a"


def workflow_config(corpus: Path, tokenizer: Path, runs: dict) -> dict:
    """The `tiny` preset (130 updates) on a local corpus and tokenizer, plus a GPU variant of it.

    The sizes are the same in every config of this module, so the cache recipe (sized for the largest budget)
    never changes and the cache job runs once.
    """
    size = {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}
    gpu = {"runtime": {"device": "cuda:0"}}
    return {
        "data": {"corpus": str(corpus), "tokenizer": str(tokenizer), "cache_dir": "results/data/cache"},
        "sizes": {"tiny": size, "tiny-gpu": {**size, "threads": 4, "overrides": gpu}},
        "recipe_defaults": {
            "training": {"checkpoint_policy": "interval", "checkpoint_every": 4, "log_every": 1}
        },
        "runs": runs,
    }


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Setup:
    """The scratch workflow directory shared by this module's tests."""

    def __init__(self, root: Path, cluster: Cluster, corpus: Path, tokenizer: Path) -> None:
        self.root, self.cluster, self.corpus, self.tokenizer = root, cluster, corpus, tokenizer

    def profile(self, name: str, runs: dict, cpu_only: bool = True) -> Path:
        config = write_yaml(self.root / f"{name}.yaml", workflow_config(self.corpus, self.tokenizer, runs))
        return derive_profile(self.root / f"profile-{name}", self.cluster, config, cpu_only=cpu_only)

    def run(self, profile: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return run_snakemake(self.root, profile, *args, timeout=timeout)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_corpus_dir: Path, tiny_tokenizer_dir: Path) -> Setup:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set but {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm-workflow")
    shutil.copy(REPO / "workflow_config.yaml", root / "workflow_config.yaml")
    return Setup(root, detect_cluster(), tiny_corpus_dir, tiny_tokenizer_dir)


@dataclass
class Interrupted:
    """What the first, interrupted controller left behind, and the rerun."""

    setup: Setup
    training_seen: bool
    exit_code: int
    output: str
    status: dict
    result_existed: bool
    rows_before: int
    rerun: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def interrupted(setup: Setup) -> Interrupted:
    """`snakemake <report>`, Ctrl-C once the training job logs an update, then the same command again."""
    profile = setup.profile("pipeline", {"tiny-a": {"size": "tiny"}})
    run_dir = setup.root / RUN_DIR
    log = setup.root / "controller-interrupted.log"
    controller = start_snakemake(setup.root, profile, log, REPORT)

    def training() -> bool:
        return any(row["event"] == "train" for row in read_jsonl(run_dir / "metrics.jsonl"))

    try:
        wait_for(lambda: training() or controller.poll() is not None, 300)
        seen = training()
    finally:
        code = interrupt(controller, timeout=60)
    output = log.read_text(encoding="utf-8")
    ids = [job.slurm_id for job in submitted_jobs(output)]
    wait_for(lambda: not queued(ids), 30)  # the cancelled job's SIGTERM handling ends within KillWait
    status = read_json(run_dir / "status.json") if (run_dir / "status.json").exists() else {}
    result_existed = (run_dir / "result.json").exists()
    rows_before = len(read_jsonl(run_dir / "metrics.jsonl"))
    rerun = setup.run(profile, REPORT) if seen else subprocess.CompletedProcess([], 1, "", "not rerun")
    return Interrupted(setup, seen, code, output, status, result_existed, rows_before, rerun)


def jobs_by_rule(jobs: list[SubmittedJob]) -> dict[str, list[SubmittedJob]]:
    grouped: dict[str, list[SubmittedJob]] = {}
    for job in jobs:
        grouped.setdefault(job.rule, []).append(job)
    return grouped


def test_ctrl_c_cancels_the_slurm_job_and_the_trainer_saves_its_state(interrupted: Interrupted) -> None:
    output = interrupted.output
    assert interrupted.training_seen, "training never started:\n" + output[-6000:]
    assert interrupted.exit_code != 0, output[-6000:]
    jobs = jobs_by_rule(submitted_jobs(output))
    assert sorted(jobs) == ["prepare_cache", "train_run"], output[-6000:]
    ids = [job.slurm_id for group in jobs.values() for job in group]
    assert not queued(ids), f"Slurm jobs still queued after Ctrl-C: {queued(ids)}"
    train_id = jobs["train_run"][0].slurm_id
    assert wait_for(lambda: sacct_states([train_id]) == {train_id: "CANCELLED"}, 30), sacct_states([train_id])
    # SIGTERM from scancel reached the trainer, which saved its state within Slurm's KillWait
    assert interrupted.status.get("status") == "interrupted", interrupted.status
    assert interrupted.status["step"] > 0
    assert not interrupted.result_existed


def test_rerun_resumes_and_finishes_the_pipeline_through_slurm(interrupted: Interrupted) -> None:
    root, rerun = interrupted.setup.root, interrupted.rerun
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-6000:]
    # the cache is reused; the report is a localrule and runs in the controller, not as a Slurm job
    jobs = submitted_jobs(output)
    assert [job.rule for job in jobs] == ["train_run"], output[-6000:]
    assert (root / REPORT).is_file()

    rows = read_jsonl(root / RUN_DIR / "metrics.jsonl")
    new_rows = rows[interrupted.rows_before :]
    assert new_rows, "the rerun wrote no metrics"
    assert new_rows[0]["step"] > 0, f"the rerun restarted instead of resuming: {new_rows[0]}"
    result = read_json(root / RUN_DIR / "result.json")
    assert result["step"] > interrupted.status["step"]

    # every job of both controllers went through Slurm: accounted, logged by the plugin
    all_jobs = submitted_jobs(interrupted.output) + jobs
    ids = [job.slurm_id for job in all_jobs]
    expected = {job.slurm_id: "COMPLETED" for job in all_jobs}
    expected[submitted_jobs(interrupted.output)[-1].slurm_id] = "CANCELLED"
    assert wait_for(lambda: sacct_states(ids) == expected, 30), (sacct_states(ids), expected)
    for job in all_jobs:
        assert job.log.is_file(), f"no Slurm log for {job}"
        assert f"rule {job.rule}" in job.log.read_text(encoding="utf-8"), job.log

    # the trainer ran inside the allocation and used the CPUs Slurm gave it (--cpus-per-task = rule threads);
    # the resumed session describes itself in environment-resume.json (environment.json: the first session's)
    assert (root / RUN_DIR / "environment.json").is_file()
    environment = read_json(root / RUN_DIR / "environment-resume.json")
    assert environment["slurm"]["SLURM_JOB_ID"] == jobs[0].slurm_id
    assert environment["slurm"]["SLURM_CPUS_PER_TASK"] == "1"
    assert environment["threads"] == 1


def test_sbatch_call_of_a_gpu_training_job(setup: Setup) -> None:
    """The shipped profile (only account and partition swapped for this cluster's) on a GPU recipe."""
    profile = setup.profile("gpu", {"tiny-on-gpu": {"size": "tiny-gpu"}}, cpu_only=False)
    proc = setup.run(profile, "results/runs/tiny-on-gpu/result.json", "--verbose", timeout=300)
    output = proc.stdout + proc.stderr
    calls = [ln for ln in output.splitlines() if ln.startswith("sbatch call:") and "rule_train_run" in ln]
    submitted = [job.slurm_id for job in submitted_jobs(output)]
    if submitted:  # a cluster with GPUs accepted it: do not leave it running
        subprocess.run(["scancel", *submitted], check=False)
    assert calls, output[-6000:]
    first = calls[0].split()
    for expected in ("--gpus=1", "--cpus-per-task=4"):
        assert expected in first, calls[0]
    for flag, value in (
        ("-A", setup.cluster.account),
        ("-p", setup.cluster.partition),
        ("-t", "10"),
        ("--mem", "1000"),
    ):
        assert first[first.index(flag) + 1] == value, f"{flag}: {calls[0]}"
    if not submitted:  # no GPU here: sbatch refused, and the retry asked for twice the time
        assert len(calls) == 2, calls
        second = calls[1].split()
        assert second[second.index("-t") + 1] == "20", calls[1]
