"""Rerun means complete: the controller killed (kill -9) during each kind of local job of a small campaign,
the orphaned job left to finish, `--unlock`, then the same command once: it exits 0, a dry run has nothing to
do, and every file the campaign decided equals the uninterrupted campaign's. And a run that exits 0 has built
its targets: one that Snakemake leaves unbuilt fails in one line."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from faults_driver import kill_controller_during, kill_controller_during_write
from faults_fingerprint import differences, fingerprint
from workflow_helpers import snakemake, snakemake_command, snakemake_env, write_config

pytestmark = pytest.mark.slow

TOY_TUNING = {  # one candidate: the tuner's choice, and so the campaign, is the same in every session
    "size": "t-s",
    "space": "cpu",
    "data_mode": "synthetic",
    "budget_minutes": 5,
    "candidate_timeout_seconds": 120,
    "min_start_seconds": 5,
    "warmup": 1,
    "steps": 1,
    "windows": 1,
    "stage1": [[8, False]],
    "attention_variants": [],
    "cpu_amp_variants": [],
    "threads": [],
}

LOCAL_JOBS: dict[str, list[str]] = {
    "campaign-plan": ["campaign", "plan"],
    "campaign-select": ["campaign", "select"],
    "campaign-rank": ["campaign", "rank"],
    "campaign-report": ["report"],
    "tuning-select": ["tune", "select"],
}
PLAN_FILE = "results/campaign/settings.json"


def campaign_config(fault_benchmark: ModuleType) -> dict[str, Any]:
    """The fault benchmark's short campaign (2 -> 2 runs, one diverging), its first size tuned."""
    config = fault_benchmark.campaign_config("short")
    config["tuning"] = {"default_profiles": [], "profiles": {"toy": TOY_TUNING}}
    config["campaign"]["tuning"] = {"t-s": "toy"}
    return config


@dataclass
class Reference:
    base: Path
    """The data stage and the tuning, built once and copied for every case."""
    finished: Path
    """The uninterrupted campaign: the cases of its later jobs start from it, less what those jobs wrote."""
    fingerprint: dict[str, Any]


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


TUNING_SELECTED = "results/toy-tuning/selected.yaml"
TUNING_OUTPUTS = (TUNING_SELECTED, "results/toy-tuning/summary.json", "results/toy-tuning/throughput.png")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, fault_benchmark: ModuleType) -> Reference:
    base = tmp_path_factory.mktemp("base")
    configfile = write_config(base / "config.yaml", campaign_config(fault_benchmark))
    ok(snakemake(base, configfile, "--cores", "2", "data", TUNING_SELECTED))
    whole = shutil.copytree(base, tmp_path_factory.mktemp("uninterrupted") / "w", symlinks=True)
    ok(snakemake(whole, whole / "config.yaml", "--cores", "2", "campaign", timeout=600))
    return Reference(base, whole, fingerprint(whole))


# The jobs that run after the campaign's first stage has trained: their cases start from the finished
# campaign without the files of those jobs and the jobs after them (the same tree as when they first ran),
# not from the base, where the rerun would train the campaign's first stage again for nothing.
AFTER_THE_FIRST_STAGE = {
    "campaign-select": "select_run",
    "campaign-rank": "rank_stage",
    "campaign-report": "report_campaign",
}


def before_rule_ran(reference: Reference, workdir: Path, rule: str) -> Path:
    """A copy of the finished campaign without what every job of ``rule``, and every job after it, wrote: a
    training job's whole run directory, the declared outputs of the others."""
    workdir = shutil.copytree(reference.finished, workdir, symlinks=True)
    planned = ok(snakemake(workdir, workdir / "config.yaml", "-n", "--forcerun", rule, "campaign"))
    jobs = re.findall(r"^(?:local)?rule (\w+):\n(?:    (?!output:).*\n)*    output: (.+)$", planned, re.M)
    assert any(name == rule for name, _ in jobs), planned
    for name, outputs in jobs:
        for output in outputs.split(", "):
            if name == "train_campaign":
                shutil.rmtree(workdir / Path(output).parent)
            else:
                (workdir / output).unlink(missing_ok=True)
    return workdir


def stamp_job_log(workdir: Path, plan_file: str) -> str:
    """The log of the job that writes ``plan_file`` with its stamp (rules/plan_files.smk), from a dry run."""
    planned = ok(snakemake(workdir, workdir / "config.yaml", "-n", plan_file))
    stamp = re.search(r"output: results/\.plan/(\S+)", planned)
    assert stamp, planned
    return f"logs/stamp_plan_file/{stamp[1]}.log"


def start_campaign(workdir: Path) -> subprocess.Popen:
    command = snakemake_command(workdir, workdir / "config.yaml", "--cores", "2", "campaign")
    log = (workdir / "killed.log").open("w")
    streams = {"stdout": log, "stderr": subprocess.STDOUT}
    return subprocess.Popen(command, cwd=workdir, env=snakemake_env(), start_new_session=True, **streams)


@pytest.mark.parametrize("job", [*LOCAL_JOBS, "plan-file-write"])
def test_a_controller_killed_during_a_local_job_needs_one_rerun(
    reference: Reference, tmp_path: Path, job: str
) -> None:
    if job in AFTER_THE_FIRST_STAGE:
        workdir = before_rule_ran(reference, tmp_path / "w", AFTER_THE_FIRST_STAGE[job])
    else:
        workdir = shutil.copytree(reference.base, tmp_path / "w", symlinks=True)
    stamp_log = ""
    if job == "plan-file-write":  # `data` wrote every plan file of the base: this one is written again
        (workdir / PLAN_FILE).unlink()
        key = hashlib.sha256(PLAN_FILE.encode()).hexdigest()[:16]  # its stamp's name begins with its path's
        for stamp in (workdir / "results/.plan").glob(f"{key}-*"):
            stamp.unlink()
        stamp_log = stamp_job_log(workdir, PLAN_FILE)
    if job == "tuning-select":  # the tuning is part of the base: its selection runs again
        for output in TUNING_OUTPUTS:
            (workdir / output).unlink()
    controller = start_campaign(workdir)
    try:
        if job in LOCAL_JOBS:
            hit = kill_controller_during(controller, workdir, LOCAL_JOBS[job]) is not None
        else:
            hit = kill_controller_during_write(controller, workdir, PLAN_FILE, stamp_log)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert hit, (workdir / "killed.log").read_text()[-3000:]
    if job == "plan-file-write":  # killed inside the job: the file written, its stamp not yet
        assert (workdir / PLAN_FILE).exists() and not list((workdir / "results/.plan").glob(f"{key}-*"))
    configfile = workdir / "config.yaml"
    ok(snakemake(workdir, configfile, "--cores", "2", "campaign", "--unlock"))
    ok(snakemake(workdir, configfile, "--cores", "2", "campaign", timeout=600))  # the one rerun
    assert "Nothing to be done" in ok(snakemake(workdir, configfile, "--cores", "2", "-n", "campaign"))
    assert differences(reference.fingerprint, fingerprint(workdir)) == []


# Snakemake's command line with one job left out of what must run, as Snakemake 9 leaves out the jobs
# behind an `ancient` input of a job that reruns (rules/common.smk): the run ends without error and without
# its report.
SKIPS_THE_REPORT = """
import runpy, sys
import snakemake.api  # imports snakemake.dag in its own order
from snakemake import dag
original = dag.DAG.update_needrun
async def update_needrun(self, *args, **kwargs):
    await original(self, *args, **kwargs)
    for job in list(self._needrun):
        if job.rule.name == "report_campaign":
            self._needrun.discard(job)
            self._n_until_ready.pop(job, None)
    self._len = len(self._finished | self._needrun)
dag.DAG.update_needrun = update_needrun
sys.argv = ["snakemake", *sys.argv[1:]]
runpy.run_module("snakemake", run_name="__main__")
"""


def test_a_run_that_leaves_a_target_unbuilt_fails_in_one_line(reference: Reference, tmp_path: Path) -> None:
    workdir = before_rule_ran(reference, tmp_path / "w", "rank_stage")  # a job before the report runs
    args = snakemake_command(workdir, workdir / "config.yaml", "--cores", "2", "campaign")[3:]
    proc = subprocess.run(
        [sys.executable, "-c", SKIPS_THE_REPORT, *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
        env=snakemake_env(),
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not (workdir / "results/campaign/report/comparison.json").exists()
    # the report's files: comparison.json first, then as many more as the report rule has outputs
    line = (
        r"error: the run ended without building results/campaign/report/comparison.json and \d+ more, which "
        r"the requested targets need; rerun the same command to build them \(`snakemake -n` with the same "
        r"options lists what is left\)"
    )
    assert any(re.fullmatch(line, text) for text in proc.stderr.splitlines()), proc.stderr[-3000:]
    assert "Results (" not in proc.stdout  # no closing summary of results that are not there
    ok(snakemake(workdir, workdir / "config.yaml", "--cores", "2", "campaign"))  # as it says
    assert (workdir / "results/campaign/report/comparison.json").is_file()


STAGE1_RECIPE = "results/campaign/stage1/t-s-lr0.003-wd0.1/recipe.yaml"


def refused(proc: subprocess.CompletedProcess, log: str, path: str) -> str:
    """The failed job's one-line error, as its log and the closing lines give it."""
    assert proc.returncode != 0, proc.stdout[-3000:]
    error = Path(log).read_text().strip().splitlines()[-1]
    assert error.startswith(f"error: {path} ") and "delete it and rerun the same snakemake command" in error
    assert error in proc.stdout + proc.stderr  # the closing lines name it
    return error


def test_edited_settings_and_stage_recipes_are_refused_and_the_advice_works(
    reference: Reference, tmp_path: Path
) -> None:
    workdir = shutil.copytree(reference.base, tmp_path / "w", symlinks=True)
    configfile = workdir / "config.yaml"
    ok(snakemake(workdir, configfile, "--cores", "2", STAGE1_RECIPE))  # planned, not trained

    settings = workdir / PLAN_FILE
    settings.write_text(settings.read_text().replace('"weight_decay": [\n', '"weight_decay": [\n0.2,\n', 1))
    proc = snakemake(workdir, configfile, "--cores", "2", "campaign")
    error = refused(proc, workdir / "logs/plan_campaign/campaign.log", PLAN_FILE)
    assert "is not what the workflow config says" in error
    # a failing `campaign plan ... | tee` fails its job (set -euo pipefail): no "missing output files" wait
    assert "Failed job log(s): logs/plan_campaign/campaign.log" in proc.stdout + proc.stderr
    settings.unlink()  # as it says
    ok(snakemake(workdir, configfile, "--cores", "2", STAGE1_RECIPE))

    recipe = workdir / STAGE1_RECIPE
    edited = recipe.read_text().replace("lr: 0.003", "lr: 0.03")
    assert edited != recipe.read_text()
    recipe.write_text(edited)
    proc = snakemake(workdir, configfile, "--cores", "2", "campaign")
    log = workdir / "logs/train_campaign/stage1/t-s-lr0.003-wd0.1.log"
    assert "is not what `campaign plan` wrote (edited since?)" in refused(proc, log, STAGE1_RECIPE)
    assert not (recipe.parent / "result.json").exists()  # nothing was trained on it
    recipe.unlink()  # as it says
    ok(snakemake(workdir, configfile, "--cores", "2", "campaign"))
    assert differences(reference.fingerprint, fingerprint(workdir)) == []
