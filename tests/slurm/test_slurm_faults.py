"""Faults only a Slurm cluster produces, through profiles/slurm on a real cluster.

- A training job reaching its time limit: the early signal the profile asks sbatch for (`--signal=TERM@120`)
  reaches the trainer inside the job step, which saves its state and stops before the limit; Snakemake's
  retry (more time) resumes from that state and the run completes. The limit is shortened once the trainer
  has logged an update (as an admin or `scontrol update` by the user would): slurmctld sends the signal at
  its 30 s checks, so with a limit fixed at submission a job slow to start (a busy machine) got it before its
  step existed and ran into its limit. The trainer is frozen (SIGSTOP) from then until the signal is pending
  for it, so it is mid-run when the signal comes however long slurmctld takes, and the run can be short.
- A running training job requeued by Slurm (`scontrol requeue`, as preemption does): the trainer saves its
  state, the controller keeps waiting while Slurm holds the job pending (it polls `squeue` meanwhile and
  submits no retry of its own), and the same Slurm job, restarted, resumes the run.

- `benchmarks/faults.py --executor slurm`, short: one fault of each Slurm kind (scancel, time limit, requeue,
  node down, kill -9 of the controller) in a 2 -> 2 campaign, rerun until complete, 0 differences.

Budget: about 10 min on the CI box (runs long enough to be interrupted, a campaign twice, Slurm's polling).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from slurm_helpers import (
    REPO,
    REQUIRE_ENV,
    Cluster,
    counting_shims,
    derive_profile,
    detect_cluster,
    shim_calls,
    signal_reached,
    start_snakemake,
    submitted_jobs,
    trainers,
    unavailable_reason,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SIGNAL_LEAD = 120
"""Seconds before the limit the shipped profile asks Slurm for SIGTERM (`slurm_extra`)."""


def workflow_config(corpus: Path, tokenizer: Path, runs: dict) -> dict:
    """`tiny` made long by repeating its data: `long` (6 passes, 22 s here) and `requeued` (4 passes).

    `long`'s limit (10 min, 20 on the retry) is shortened by the test.

    Both sizes are in every config of this module, so the cache recipe never changes and it is prepared once.
    Only a signal saves state here (no rolling checkpoint before the run ends).
    """
    base = {"preset": "tiny", "threads": 1, "mem_mb": 1000}

    def repeated(passes: int) -> dict:
        training = {"tokens_per_parameter": passes, "data_passes": passes, "epoch_tokens_per_parameter": 2}
        return {"training": training}

    return {
        "data": {"corpus": str(corpus), "tokenizer": str(tokenizer), "cache_dir": "results/data/cache"},
        "sizes": {
            "long": {**base, "runtime_minutes": 10, "overrides": repeated(6)},
            "requeued": {**base, "runtime_minutes": 10, "overrides": repeated(4)},
        },
        "recipe_defaults": {
            "training": {"checkpoint_policy": "interval", "checkpoint_every": 100000, "log_every": 5}
        },
        "runs": runs,
    }


class Setup:
    def __init__(self, root: Path, cluster: Cluster, corpus: Path, tokenizer: Path) -> None:
        self.root, self.cluster, self.corpus, self.tokenizer = root, cluster, corpus, tokenizer

    def profile(self, name: str, runs: dict, changes: dict | None = None) -> Path:
        config = self.root / f"{name}.yaml"
        text = yaml.safe_dump(workflow_config(self.corpus, self.tokenizer, runs), sort_keys=False)
        config.write_text(text, encoding="utf-8")
        return derive_profile(self.root / f"profile-{name}", self.cluster, config, True, changes)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tiny_corpus_dir: Path, tiny_tokenizer_dir: Path) -> Setup:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set but {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm-faults")
    shutil.copy(REPO / "workflow_config.yaml", root / "workflow_config.yaml")
    return Setup(root, detect_cluster(), tiny_corpus_dir, tiny_tokenizer_dir)


def sacct_rows(slurm_id: str) -> list[dict[str, str]]:
    """Every instance of a job (`-D`: a requeued job's earlier runs too), oldest first."""
    fields = ["JobID", "State", "ElapsedRaw", "Timelimit"]
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-D", "-j", slurm_id, "-o", ",".join(fields)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]


def job_state(slurm_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def run_log(run_dir: Path) -> str:
    return (run_dir / "run.log").read_text(encoding="utf-8")


def assert_saved_then_resumed(log: str) -> int:
    """run.log says the trainer saved its state on a signal and a later session resumed at that very step."""
    saved = re.search(r"interrupted at step (\d+); state saved to (\S+latest\.pt)", log)
    assert saved, log[-3000:]
    step = int(saved.group(1))
    assert step > 0, log[-3000:]
    resumed = re.search(rf"resumed from \S+latest\.pt at step {step}/", log[saved.end() :])
    assert resumed, f"no session resumed at step {step}:\n{log[-3000:]}"
    return step


def training_job(run_dir: Path, log: Path) -> str | None:
    """The Slurm id of the run's training job once its trainer has logged an update."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file() or '"event": "train"' not in metrics.read_text():
        return None
    jobs = [j for j in submitted_jobs(log.read_text()) if j.rule == "train_run"]
    return jobs[0].slurm_id if jobs else None


@contextlib.contextmanager
def training_controller(
    setup: Setup, profile: Path, run_dir: Path, log: Path, *args: str, path_first: Path | None = None
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A background controller (output to ``log``) for the run's result.json, once its trainer has logged an
    update: (the controller, the training job's Slurm id). Killed on leaving if it still runs."""
    target = str((run_dir / "result.json").relative_to(setup.root))
    controller = start_snakemake(setup.root, profile, log, target, *args, path_first=path_first)
    try:
        assert wait_for(lambda: training_job(run_dir, log) is not None or controller.poll() is not None, 300)
        slurm_id = training_job(run_dir, log)
        assert slurm_id is not None, log.read_text()[-6000:]
        yield controller, slurm_id
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()


def seconds(duration: str) -> int:
    """A Slurm duration ([D-][H:]M:SS, as squeue's and sacct's columns print it) in seconds."""
    days, _, clock = duration.rpartition("-")
    hours, minutes, secs = [0, 0, *(int(part) for part in clock.split(":"))][-3:]
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + secs


def elapsed_seconds(slurm_id: str) -> int:
    """How long a running job has run, from the controller (sacct may not have its start yet)."""
    query = ["squeue", "-h", "-j", slurm_id, "-o", "%M"]
    out = subprocess.run(query, capture_output=True, text=True, check=True, timeout=30).stdout
    return seconds(out.strip())


def test_a_job_at_its_time_limit_saves_its_state_and_the_retry_resumes(setup: Setup) -> None:
    profile = setup.profile("timelimit", {"long": {"size": "long"}})
    run_dir, log = setup.root / "results/runs/long", setup.root / "controller-timelimit.log"
    with training_controller(setup, profile, run_dir, log, "--verbose") as (controller, slurm_id):
        found = [pid for pid, run in trainers(setup.root).items() if run == run_dir]
        assert len(found) == 1, f"not one trainer of {run_dir} running: {found}"
        trainer = found[0]
        os.kill(trainer, signal.SIGSTOP)
        try:
            # a limit 1-2 min away: within the signal's lead, so slurmctld's next check (<= 30 s) sends it,
            # and the trainer has over 30 s to save its state before the limit
            limit = elapsed_seconds(slurm_id) // 60 + 2
            update = ["scontrol", "update", f"jobid={slurm_id}", f"TimeLimit={limit}"]
            subprocess.run(update, check=True, timeout=30)
            reached = wait_for(lambda: signal_reached(trainer, signal.SIGTERM), 90)
            assert reached, "no early signal from Slurm"
        finally:
            with contextlib.suppress(ProcessLookupError):  # Slurm resumed it, and it may have ended since
                os.kill(trainer, signal.SIGCONT)
        assert controller.wait(timeout=900) == 0, log.read_text()[-6000:]
    output = log.read_text()
    calls = [ln for ln in output.splitlines() if ln.startswith("sbatch call:") and "rule_train_run" in ln]
    assert calls and all(f"--signal=TERM@{SIGNAL_LEAD}" in ln for ln in calls), calls
    trainings = [job for job in submitted_jobs(output) if job.rule == "train_run"]
    assert trainings[0].slurm_id == slurm_id and len(trainings) >= 2, output[-6000:]
    first = sacct_rows(slurm_id)[-1]
    # the trainer stopped on the early signal and the job failed before Slurm's limit killed it (not TIMEOUT)
    assert first["State"] == "FAILED", first
    assert seconds(first["Timelimit"]) == limit * 60 and int(first["ElapsedRaw"]) < limit * 60, first
    step = assert_saved_then_resumed(run_log(run_dir))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["step"] > step


def test_a_requeued_job_resumes_and_the_controller_waits_for_it(setup: Setup) -> None:
    profile = setup.profile("requeue", {"requeued": {"size": "requeued"}})
    run_dir, log = setup.root / "results/runs/requeued", setup.root / "controller-requeue.log"
    shims = counting_shims(setup.root / "shims-requeue")
    with training_controller(setup, profile, run_dir, log, path_first=shims) as (controller, slurm_id):
        subprocess.run(["scontrol", "requeue", slurm_id], check=True, timeout=30)
        # Slurm holds a requeued job pending (about 2 min): the controller polls meanwhile and does not fail
        assert wait_for(lambda: job_state(slurm_id) == "PENDING", 60), job_state(slurm_id)
        polls = status_queries(shims)
        assert wait_for(lambda: status_queries(shims) > polls or controller.poll() is not None, 240)
        assert controller.poll() is None, log.read_text()[-6000:]
        assert job_state(slurm_id) == "PENDING"
        subprocess.run(["scontrol", "update", f"jobid={slurm_id}", "StartTime=now"], check=True, timeout=30)
        assert controller.wait(timeout=600) == 0, log.read_text()[-6000:]
    output = log.read_text()
    trainings = [job for job in submitted_jobs(output) if job.rule == "train_run"]
    assert [job.slurm_id for job in trainings] == [slurm_id], "the controller submitted a job of its own"
    assert wait_for(lambda: [r["State"] for r in sacct_rows(slurm_id)] == ["REQUEUED", "COMPLETED"], 30), (
        sacct_rows(slurm_id)
    )
    step = assert_saved_then_resumed(run_log(run_dir))
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["slurm"]["SLURM_JOB_ID"] == slurm_id
    assert json.loads((run_dir / "result.json").read_text())["step"] > step


def status_queries(shims: Path) -> int:
    """The controller's job-status queries so far (the profile asks squeue; the plugin's default is sacct)."""
    return shim_calls(shims, "sacct") + shim_calls(shims, "squeue")


def test_faulted_campaign_through_slurm_equals_the_uninterrupted_one(
    setup: Setup, fault_benchmark: ModuleType
) -> None:
    """The short version of `benchmarks/faults.py --executor slurm`: one fault of each Slurm kind."""
    benchmark = fault_benchmark
    kinds = list(benchmark.SLURM_KINDS)
    report = benchmark.run(setup.root / "faults", [1], len(kinds), shape="short", executor="slurm")
    (seed,) = report["seeds"]
    assert seed["faults_by_kind"] == dict.fromkeys(kinds, 1), json.dumps(seed, indent=1)
    assert seed["runs_compared"] == 4
    assert seed["differences"] == [], json.dumps(seed, indent=1)
