"""The fault benchmark's Slurm control: its profile, its jobs in the queue and the Slurm faults it injects."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from faults_driver import LOCAL_JOB_KIND, trainers, wait_until
from snakemake_driver import REPO

SLURM_KINDS = ("scancel", "time_limit", "requeue", "node_down", "kill_controller", LOCAL_JOB_KIND)
"""Faults of ``--executor slurm``: `scancel` of a training job, its time limit cut to what it has run,
`scontrol requeue` (as preemption does), its node set DOWN (then resumed), kill -9 of the controller (then its
jobs are cancelled, as the README says, and `--unlock`), also while one of its local jobs runs."""
SLURMD_KIND = "kill_slurmd"
"""Opt-in (``--kinds``): kill -9 of the slurmd of the node running a training job, this machine's (a local
cluster, as root), restarted ``SLURMD_DOWN_SECONDS`` later with its own command line. Its jobs run on."""
SLURMD_DOWN_SECONDS = 20.0


def _slurm(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout


def slurm_profile(workdir: Path) -> Path:
    """profiles/slurm for the cluster `sbatch` talks to: its first account of this user and default
    partition, status checks from 1 s (jobs here take seconds), CPU only; the workflow config comes from the
    command line."""
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout
    accounts = _slurm("sacctmgr", "-n", "-P", "-s", "list", "user", user.strip(), "format=account").split()
    partitions = _slurm("sinfo", "-h", "-o", "%P").split()
    default = [p.rstrip("*") for p in partitions if p.endswith("*")] or [p.rstrip("*") for p in partitions]
    if not accounts or not default:
        sys.exit(f"no Slurm account ({accounts}) or partition ({partitions}) for {user.strip()}")
    profile["default-resources"].update(slurm_account=accounts[0], slurm_partition=default[0])
    for key in ("configfile", "replace-workflow-config", "set-resources"):
        profile.pop(key, None)
    profile["slurm-init-seconds-before-status-checks"] = 1
    directory = workdir / "slurm-profile"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return directory


def slurm_jobs(workdir: Path) -> dict[str, str]:
    """This workdir's Slurm jobs still in the queue: job id -> state (PENDING, RUNNING, COMPLETING...)."""
    jobs = {}
    for line in _slurm("squeue", "-h", "-o", "%i|%T|%Z").splitlines():
        job_id, state, cwd = line.split("|", 2)
        if cwd == str(workdir):
            jobs[job_id] = state
    return jobs


def slurm_job_of(pid: int) -> str | None:
    """The Slurm job a process runs in."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ids = [item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"SLURM_JOB_ID=")]
    return ids[0] if ids else None


def release_held(workdir: Path, job_ids: list[str]) -> None:
    """Start requeued jobs now: Slurm otherwise holds a requeued job ~120 s (BeginTime) before it may run."""
    pending = set(job_ids)

    def released() -> bool:
        states = slurm_jobs(workdir)
        for job in sorted(pending):
            if states.get(job) == "PENDING":
                subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], capture_output=True)
                pending.discard(job)
            elif job not in states:
                pending.discard(job)
        return not pending

    wait_until(released, 60)


def cancel_slurm_jobs(workdir: Path) -> None:
    """scancel every job of this workdir and wait until Slurm has none left (their trainers saved)."""
    jobs = list(slurm_jobs(workdir))
    if jobs:
        subprocess.run(["scancel", *jobs], capture_output=True)
    wait_until(lambda: not slurm_jobs(workdir), 120)


def inject_slurm(
    kind: str, controller: subprocess.Popen, workdir: Path, rng: random.Random
) -> tuple[str, list[str]] | None:
    """One Slurm fault on a random running training job now: (what was hit, the run directories hit)."""
    running = trainers(workdir)
    jobs = {pid: job for pid in sorted(running) if (job := slurm_job_of(pid))}
    if not jobs:
        return None
    if kind == SLURMD_KIND:  # not under the except below: its errors (slurmd not back) end the benchmark
        return kill_slurmd(workdir, {pid: running[pid] for pid in jobs})
    pid = rng.choice(sorted(jobs))
    job, run = jobs[pid], str(running[pid].relative_to(workdir))
    try:
        return _hit_slurm_job(kind, workdir, job, run, jobs, running)
    except subprocess.CalledProcessError:  # the job ended meanwhile: nothing hit, try again shortly
        return None


def _hit_slurm_job(
    kind: str, workdir: Path, job: str, run: str, jobs: dict[int, str], running: dict[int, Path]
) -> tuple[str, list[str]]:
    if kind == "scancel":
        _slurm("scancel", job)
    elif kind == "time_limit":  # the limit now (1 min): the profile's early SIGTERM is due at once
        _slurm("scontrol", "update", f"jobid={job}", "TimeLimit=1")
    elif kind == "requeue":
        _slurm("scontrol", "requeue", job)
        release_held(workdir, [job])
    else:  # node_down: every job on the node fails (NODE_FAIL); Snakemake retries it (or Slurm requeues it)
        node = _slurm("squeue", "-h", "-j", job, "-o", "%N").strip()
        hit = {j: str(running[p].relative_to(workdir)) for p, j in jobs.items()}
        _slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=faults benchmark")
        wait_until(lambda: not {j for j, s in slurm_jobs(workdir).items() if s == "RUNNING"} & set(hit), 60)
        # ReturnToService may bring it back by itself, even between a look and the resume
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        # no release_held here: the node may still be ending the old instance, and a requeued job launched
        # beside it fails ("Duplicate jobid"), drains the node and is held; Slurm's own hold waits it out
        return f"node {node}: jobs {', '.join(sorted(hit))}", sorted(set(hit.values()))
    return f"job {job} ({run})", [run]


def slurmd_pid_file() -> Path:
    lines = _slurm("scontrol", "show", "config").splitlines()
    return Path(next(line.split("=", 1)[1].strip() for line in lines if line.startswith("SlurmdPidFile")))


def slurmd_pid(pid_file: Path) -> int | None:
    """The pid of this machine's slurmd, from its pid file; None while it names no live slurmd."""
    try:
        pid = int(pid_file.read_text().split()[0])
        alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        is_slurmd = Path(f"/proc/{pid}/exe").resolve().name.startswith("slurmd")  # Debian: slurmd-wlm
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive and is_slurmd else None


def kill_slurmd(workdir: Path, running: dict[int, Path]) -> tuple[str, list[str]]:
    """kill -9 of slurmd while jobs run, then its own command line again ``SLURMD_DOWN_SECONDS`` later (as a
    supervisor would). The jobs' slurmstepd run on; a job Slurm failed to launch meanwhile ("launch failed
    requeued held") is released. A record of the old pid in ``started-slurmd.pid`` beside its pid file's
    directory (../shared/slurm-local's, which its teardown stops) is updated to the new one."""
    pid_file = slurmd_pid_file()
    pid = slurmd_pid(pid_file)
    if pid is None:
        raise RuntimeError(f"no live slurmd in {pid_file}: is this a node of the cluster?")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    node = _slurm("sinfo", "-h", "-N", "-o", "%N").split()[0]
    os.kill(pid, signal.SIGKILL)
    try:
        wait_until(lambda: slurmd_pid(pid_file) is None, 30)
        time.sleep(SLURMD_DOWN_SECONDS)
    finally:  # whatever happens here, slurmd comes back
        subprocess.run(argv, check=True, timeout=60)  # it daemonizes and writes its pid file
    if not wait_until(lambda: slurmd_pid(pid_file) not in (None, pid), 60):
        raise RuntimeError(f"slurmd did not come back: {' '.join(argv)}")
    new_pid = slurmd_pid(pid_file)
    record = pid_file.parent.parent / "started-slurmd.pid"
    if record.is_file() and record.read_text().split() == [str(pid)]:
        record.write_text(f"{new_pid}\n")
    wait_until(lambda: not _slurm("sinfo", "-h", "-N", "-n", node, "-o", "%T").strip().endswith("*"), 120)
    for line in _slurm("squeue", "-h", "-o", "%i|%Z|%r").splitlines():
        job, cwd, reason = line.split("|", 2)
        if cwd == str(workdir) and "launch failed" in reason:
            subprocess.run(["scontrol", "release", job], capture_output=True)
    runs = sorted({str(run.relative_to(workdir)) for run in running.values()})
    down = f"down {SLURMD_DOWN_SECONDS:.0f} s"
    return f"slurmd {pid} -> {new_pid} on {node}, {down}; jobs ran on: {', '.join(runs)}", []
