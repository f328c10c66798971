"""profiles/slurm as shipped, checked without a cluster.

Its settings, and a dry run of the full-scale configuration with it: what each job would ask Slurm for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from slurm_helpers import PROFILE, REPO, SNAKEFILE

GPU_RULE = re.compile(r"^(train|bench|evaluate)_")


def load_profile() -> dict:
    return yaml.safe_load(PROFILE.read_text(encoding="utf-8"))


def evaluate(expression: str | int, attempt: int) -> int:
    """A resource expression of the profile, as Snakemake evaluates it."""
    return int(eval(str(expression), {}, {"attempt": attempt}))  # noqa: S307 - the profile's own expression


def test_profile_submits_to_the_reference_account_and_partition() -> None:
    profile = load_profile()
    assert profile["executor"] == "slurm"
    defaults = profile["default-resources"]
    assert defaults["slurm_account"] == "naiss2026-3-205-gpu"
    assert defaults["slurm_partition"] == "gpu"
    assert (REPO / profile["configfile"]).is_file()
    assert profile["replace-workflow-config"] is True


def test_profile_retries_with_more_time_and_tolerates_a_slow_filesystem() -> None:
    profile = load_profile()
    defaults = profile["default-resources"]
    for resource in ("runtime", "mem_mb"):
        assert evaluate(defaults[resource], 2) == 2 * evaluate(defaults[resource], 1) > 0
    assert profile["retries"] >= 1
    assert profile["rerun-incomplete"] is True
    assert profile["latency-wait"] >= 60
    assert profile["slurm-keep-successful-logs"] is True


def test_profile_signals_jobs_before_their_time_limit_and_lets_slurm_requeue() -> None:
    """Every job, also those with their own slurm_extra, gets SIGTERM 120 s before its limit (a 90m state
    takes up to 15 s to write, benchmarks/README.md); a node failure or preemption is requeued by Slurm."""
    profile = load_profile()
    extras = [profile["default-resources"]["slurm_extra"]]
    per_rule = profile.get("set-resources", {}).values()
    extras += [res["slurm_extra"] for res in per_rule if "slurm_extra" in res]
    for extra in extras:
        lead = re.search(r"--signal=TERM@(\d+)\b", extra)
        assert lead and int(lead.group(1)) >= 60, extra
    assert profile["slurm-requeue"] is True
    # sacct says "CANCELLED by <uid>" for an outside scancel: plugin 2.8 takes it for running, forever
    assert profile["slurm-status-command"] == "squeue"


def job_blocks(dry_run: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job a dry run lists."""
    blocks = []
    for match in re.finditer(r"^(?:local)?rule (\w+):\n((?:    .*\n)+)", dry_run, re.MULTILINE):
        resources = re.search(r"^    resources: (.*)$", match.group(2), re.MULTILINE)
        pairs = resources.group(1).split(", ") if resources else []
        blocks.append((match.group(1), dict(pair.split("=", 1) for pair in pairs if "=" in pair)))
    return blocks


@pytest.mark.slow
def test_full_scale_dry_run_asks_for_one_gpu_per_training_and_benchmark_job(tmp_path: Path) -> None:
    """From a copy of the repository root, as users launch: `snakemake --workflow-profile profiles/slurm`."""
    (tmp_path / "config").mkdir()
    shutil.copy(REPO / "config" / "cluster.yaml", tmp_path / "config" / "cluster.yaml")
    shutil.copy(REPO / "workflow_config.yaml", tmp_path / "workflow_config.yaml")
    shutil.copytree(PROFILE.parent, tmp_path / "profiles" / "slurm")
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--workflow-profile"]
    # a dry run submits nothing: no wait for a Slurm controller (tests/no-slurm-controller/scontrol)
    path = f"{REPO / 'tests' / 'no-slurm-controller'}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.run(
        [*cmd, "profiles/slurm", "-n"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    blocks = job_blocks(proc.stdout)
    gpu_jobs = [(rule, res) for rule, res in blocks if GPU_RULE.match(rule)]
    assert {"train_run", "train_campaign", "bench_candidate"} <= {rule for rule, _ in gpu_jobs}, output[
        -3000:
    ]
    for rule, resources in gpu_jobs:
        assert resources.get("gpu") == "1", (rule, resources)
        assert resources["slurm_account"] == "naiss2026-3-205-gpu" and resources["slurm_partition"] == "gpu"
        assert int(resources["runtime"]) >= 10 and int(resources["mem_mb"]) >= 1000, (rule, resources)
