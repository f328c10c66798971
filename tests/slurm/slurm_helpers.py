"""Helpers for the real-Slurm tests: find the cluster, derive a test profile, run snakemake, read sacct.

The tests submit real jobs through snakemake-executor-plugin-slurm to whatever cluster `sbatch` talks to; in
CI that is the single-node cluster `.ci/run` starts with ../shared/slurm-local/setup-slurm.sh.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the shared command builder

from faults_driver import signal_reached as signal_reached  # noqa: E402
from faults_driver import trainers as trainers  # noqa: E402 - the tests import them from here
from snakemake_driver import REPO  # noqa: E402
from snakemake_driver import SNAKEFILE as SNAKEFILE  # noqa: E402 - the tests import it from here
from snakemake_driver import snakemake_command as repository_snakemake  # noqa: E402

from tiny_llm.tuning.tuner import kill_group  # noqa: E402

PROFILE = REPO / "profiles" / "slurm" / "config.yaml"

# .ci/run sets this: there a missing or stopped cluster is a failure, not a reason to skip.
REQUIRE_ENV = "TINY_LLM_REQUIRE_SLURM"

SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)")
SBATCH_CALL = re.compile(r"^sbatch call: (sbatch .*)$", re.MULTILINE)


def _query(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout


def unavailable_reason() -> str | None:
    """Why these tests cannot talk to a Slurm cluster here, or None when they can."""
    if shutil.which("sbatch") is None:
        return "sbatch not found: these tests need a Slurm cluster (.ci/run starts one with setup-slurm.sh)"
    try:
        if "UP" not in _query("scontrol", "ping"):
            return "slurmctld does not answer `scontrol ping` (start it with setup-slurm.sh)"
    except (subprocess.SubprocessError, OSError) as exc:
        return f"`scontrol ping` failed ({exc}); start the cluster with ../shared/slurm-local/setup-slurm.sh"
    return None


@dataclass(frozen=True)
class Cluster:
    """Where the tests submit: an account of the current user and the default partition."""

    account: str
    partition: str


def detect_cluster() -> Cluster:
    user = getpass.getuser()
    accounts = _query("sacctmgr", "-n", "-P", "-s", "list", "user", user, "format=account").split()
    partitions = _query("sinfo", "-h", "-o", "%P").split()
    default = [p.rstrip("*") for p in partitions if p.endswith("*")] or [p.rstrip("*") for p in partitions]
    if not accounts or not default:
        raise RuntimeError(f"no Slurm account ({accounts}) or partition ({partitions}) for {user}")
    return Cluster(account=os.environ.get("TINY_LLM_SLURM_ACCOUNT", accounts[0]), partition=default[0])


def derive_profile(
    dest: Path, cluster: Cluster, configfile: Path, cpu_only: bool, changes: dict | None = None
) -> Path:
    """profiles/slurm with this cluster's account/partition and the test's workflow config.

    Everything else (runtime scaling, retries, latency-wait, logs, ...) is kept as shipped. ``cpu_only`` drops
    GPU requests the profile may add (clusters without GPUs). Status checks start after 1 s instead of 40 s:
    jobs here take seconds. A profile is needed (not command-line flags) because `--set-resources` on the
    command line replaces the profile's set-resources instead of extending them. ``changes`` are top-level
    settings to replace, except `set-resources`, whose rules are added to the shipped ones.
    """
    profile = yaml.safe_load(PROFILE.read_text(encoding="utf-8"))
    profile["default-resources"]["slurm_account"] = cluster.account
    profile["default-resources"]["slurm_partition"] = cluster.partition
    profile["configfile"] = str(configfile)
    profile["slurm-init-seconds-before-status-checks"] = 1
    if cpu_only:
        per_rule = profile.pop("set-resources", None) or {}
        for resources in per_rule.values():
            resources.pop("gpu", None)
        if any(per_rule.values()):
            profile["set-resources"] = {rule: res for rule, res in per_rule.items() if res}
    for key, value in (changes or {}).items():
        if key == "set-resources":
            profile[key] = {**profile.get(key, {}), **value}
        else:
            profile[key] = value
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False), encoding="utf-8")
    return dest


def snakemake_command(workdir: Path, profile_dir: Path, *args: str) -> list[str]:
    return repository_snakemake(workdir, "--workflow-profile", str(profile_dir), *args)


def run_snakemake(
    workdir: Path, profile_dir: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess:
    """Run a controller to its end.

    Past ``timeout`` it gets Ctrl-C, so it cancels its Slurm jobs, and the test fails with its output's tail.
    """
    proc = subprocess.Popen(
        snakemake_command(workdir, profile_dir, *args),
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
        raise AssertionError(
            f"snakemake {' '.join(args)} ran over {timeout} s:\n{(out + err)[-6000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_snakemake(
    workdir: Path, profile_dir: Path, log: Path, *args: str, path_first: Path | None = None
) -> subprocess.Popen:
    """A background controller in its own session, so a SIGINT sent to it reaches only it (like Ctrl-C).

    ``path_first``: a directory put first on its PATH (see :func:`counting_shims`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
    with log.open("w", encoding="utf-8") as out:
        return subprocess.Popen(
            snakemake_command(workdir, profile_dir, *args),
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def interrupt(proc: subprocess.Popen, timeout: float) -> int:
    """Ctrl-C to the controller; returns its exit code. Kills its session if it does not stop in time."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise


@dataclass(frozen=True)
class SubmittedJob:
    """One sbatch submission as the controller logged it."""

    rule: str
    slurm_id: str
    log: Path


def submitted_jobs(output: str) -> list[SubmittedJob]:
    jobs = []
    for slurm_id, log in SUBMITTED.findall(output):
        rule = re.search(r"/rule_([A-Za-z0-9_]+)/", log)
        jobs.append(SubmittedJob(rule=rule.group(1) if rule else "?", slurm_id=slurm_id, log=Path(log)))
    return jobs


def sacct_states(slurm_ids: list[str]) -> dict[str, str]:
    """Slurm job id -> accounting state of the job allocation (COMPLETED, CANCELLED, FAILED, ...)."""
    out = _query("sacct", "-n", "-P", "-X", "-j", ",".join(slurm_ids), "-o", "JobID,State")
    states = {}
    for line in out.splitlines():
        job_id, _, state = line.partition("|")
        states[job_id] = state.split()[0] if state else ""
    return states


def wait_for(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def queued(slurm_ids: list[str]) -> list[str]:
    """Those of ``slurm_ids`` still pending, running or completing."""
    out = _query("squeue", "-h", "-t", "PD,R,CG,S,CF", "-o", "%i")
    return [job_id for job_id in out.split() if job_id in slurm_ids]


def counting_shims(directory: Path, commands: tuple[str, ...] = ("sacct", "squeue")) -> Path:
    """A directory to put first on a controller's PATH: each of ``commands`` there appends one line (epoch
    time, name) to ``directory/calls.log`` and then runs the real command, so a test sees each status
    query."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "calls.log"
    log.touch()
    for name in commands:
        real = shutil.which(name)
        if real is None:
            continue
        shim = directory / name
        shim.write_text(f'#!/bin/sh\necho "$(date +%s.%N) {name}" >> "{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)
    return directory


def shim_calls(directory: Path, name: str) -> int:
    """How many times ``name`` ran through the shims of :func:`counting_shims`."""
    return sum(1 for line in (directory / "calls.log").read_text().splitlines() if line.endswith(f" {name}"))
