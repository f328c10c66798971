"""Fault injection: faults at seeded times into a running campaign, reruns until it ends, recovery times."""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from faults_driver import (
    LOCAL_JOB_COMMANDS,
    LOCAL_JOB_KIND,
    dry_run_jobs,
    is_idle,
    kill_controller_during,
    local_jobs,
    run_snakemake,
    start_controller,
    trainers,
    wait_for_no_trainers,
)
from faults_slurm import SLURMD_KIND, cancel_slurm_jobs, inject_slurm

KINDS = (
    "kill_job",
    "sigterm_controller",
    "sigint_controller",
    "kill_controller",
    "truncate_latest",
    LOCAL_JOB_KIND,
)


SAVE_WINDOW_SECONDS = 30.0
"""A trainer's ``interrupted at`` line this soon after a fault is its save on it (KillWait + the save)."""


def _events(lines: list[str], since: float) -> list[tuple[float, bool]]:
    """(epoch seconds, is a save) of run.log's ``interrupted at`` / ``start:`` / ``resumed from`` lines in the
    order written, from the whole second of ``since`` on (run.log has whole local seconds)."""
    events = []
    for line in lines:
        if not line[:4].isdigit():
            continue
        save = "interrupted at" in line
        if save or "resumed from" in line or " start:" in line:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            if stamp >= int(since):
                events.append((stamp, save))
    return events


def recovery_seconds(workdir: Path, fault: Fault) -> float | None:
    """Seconds from the fault until every run it hit trains again: run.log's first `start:` / `resumed from`
    line more than a second after the fault (a restart takes a new job or session; a start in the fault's
    own second is the trainer it hit) and after the save the hit trainer wrote on it (`interrupted at` within
    SAVE_WINDOW_SECONDS), if any; None when a run never did (it had finished, or the fault missed it)."""
    waits = []
    for run in fault.runs:
        log = workdir / run / "run.log"
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        events = _events(lines, fault.at_time)
        saves = [k for k, (stamp, save) in enumerate(events) if save]
        after = saves[0] + 1 if saves and events[saves[0]][0] <= fault.at_time + SAVE_WINDOW_SECONDS else 0
        later = [stamp for stamp, save in events[after:] if not save and stamp > fault.at_time + 1]
        if not later:
            return None
        waits.append(later[0] - fault.at_time)
    return round(max(waits), 1) if waits else None


@dataclass
class Fault:
    kind: str
    session: int
    at_seconds: float
    """Seconds into the session."""
    target: str = ""
    runs: list[str] = field(default_factory=list)
    """Run directories it interrupted (Slurm faults), for the recovery time."""
    at_time: float = 0.0
    """Wall clock (epoch seconds) of the fault."""


@dataclass
class Session:
    """One run of the snakemake command."""

    faults: int
    returncode: int
    seconds: float
    jobs_left: int = 0
    """Jobs `snakemake -n` listed after it (0: nothing to be done; -1: the dry run failed)."""


@dataclass
class FaultRun:
    seed: int
    planned_seconds: list[float] = field(default_factory=list)
    """When each fault is due, in seconds of the campaign's running clock."""
    faults: list[Fault] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    unlocks: int = 0
    seconds: float = 0.0

    @property
    def reruns(self) -> int:
        return len(self.sessions) - 1


def inject(kind: str, controller: subprocess.Popen | None, workdir: Path, rng: random.Random) -> str | None:
    """Inject one fault now; the target it hit, or None when there is nothing to hit yet."""
    if kind == "kill_job":
        running = trainers(workdir)
        if not running:
            return None
        pid = rng.choice(sorted(running))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return str(running[pid].relative_to(workdir))
    if kind == LOCAL_JOB_KIND:  # waits for one: the faults due meanwhile wait behind it
        running = [words for words in LOCAL_JOB_COMMANDS if local_jobs(workdir, words)]
        if not running or kill_controller_during(controller, workdir, running[0]) is None:
            return None
        return f"controller {controller.pid} during `{' '.join(running[0])}`"
    if kind == "truncate_latest":  # the state an interrupted run resumes from (a running one overwrites it)
        states = sorted(workdir.glob("results/campaign/stage*/*/latest.pt"))
        idle = [p for p in states if not (p.parent / "result.json").exists() and is_idle(p.parent)]
        if not idle:
            return None
        state = rng.choice(idle)
        with contextlib.suppress(FileNotFoundError):
            fraction = rng.uniform(0.0, 0.95)
            os.truncate(state, int(state.stat().st_size * fraction))
            return f"{state.relative_to(workdir)} cut to {fraction:.0%}"
        return None
    signum = {
        "sigterm_controller": signal.SIGTERM,
        "sigint_controller": signal.SIGINT,
        "kill_controller": signal.SIGKILL,
    }[kind]
    controller.send_signal(signum)
    return f"controller {controller.pid}"


def _kill_if_running(process: subprocess.Popen) -> None:
    """At exit (the benchmark failed): no controller left behind submitting jobs."""
    if process.poll() is None:
        process.kill()


def fault_times(rng: random.Random, num_faults: int, span: tuple[float, float]) -> list[float]:
    """Seeded times on the campaign's running clock, one in each equal slice of ``span`` (seconds)."""
    low, high = span
    width = (high - low) / max(num_faults, 1)
    return [round(low + width * (i + rng.random()), 2) for i in range(num_faults)]


def run_with_faults(
    workdir: Path, seed: int, num_faults: int, span: tuple[float, float], launch: list[str], kinds: list[str]
) -> FaultRun:
    """The campaign with ``num_faults`` faults at seeded random times; rerun until it completes.

    The times count the seconds the campaign has run over all its sessions, not since the latest session
    started: a fault that ends a session does not push the next one past the campaign's end, so every fault
    whose time falls inside the uninterrupted campaign's length lands (a rerun redoes work: it runs longer).
    """
    rng = random.Random(seed)
    times = fault_times(rng, num_faults, span)
    ran_before = 0.0  # seconds of the sessions before this one
    plan: list[str] = []
    while len(plan) < num_faults:
        batch = list(kinds)
        rng.shuffle(batch)
        plan += batch
    plan = plan[:num_faults]
    record = FaultRun(seed, times)
    started = time.monotonic()

    def next_kind() -> str | None:
        return plan[len(record.faults)] if len(record.faults) < len(plan) else None

    while True:
        if len(record.sessions) > 3 * num_faults + 10:
            raise RuntimeError(f"seed {seed}: still not complete after {len(record.sessions)} sessions")
        injected, killed = 0, False
        if record.sessions and next_kind() == "truncate_latest":  # between two sessions: a state left behind
            target = inject("truncate_latest", None, workdir, rng)
            if target is not None:
                record.faults.append(Fault("truncate_latest", len(record.sessions) + 1, 0.0, target))
                injected += 1
        controller = start_controller(workdir, launch)
        atexit.register(_kill_if_running, controller)
        session_start = time.monotonic()
        retry_at = session_start
        while controller.poll() is None:
            now = time.monotonic()
            kind = next_kind()
            due = kind is not None and ran_before + now - session_start >= times[len(record.faults)]
            if due and now >= retry_at:
                busy = sorted(str(r.relative_to(workdir)) for r in trainers(workdir).values())
                wall = time.time()  # when the fault begins: injecting one may take seconds (kill_slurmd: 20)
                if kind in ("scancel", "time_limit", "requeue", "node_down", SLURMD_KIND):
                    hit = inject_slurm(kind, controller, workdir, rng)
                    target, runs = hit if hit is not None else (None, [])
                else:
                    target, runs = inject(kind, controller, workdir, rng), busy
                if target is None:  # nothing to hit yet (no trainer, no interrupted run): try again shortly,
                    index = len(record.faults)  # a truncation after the next fault, which may interrupt one
                    if kind == "truncate_latest" and index + 1 < len(plan):
                        plan.insert(index + 1, plan.pop(index))
                    retry_at = now + (0.0 if kind == LOCAL_JOB_KIND else 0.5)  # local jobs last a second
                    continue
                session = len(record.sessions) + 1
                record.faults.append(Fault(kind, session, round(now - session_start, 2), target, runs, wall))
                injected += 1
                killed = killed or kind in ("kill_controller", LOCAL_JOB_KIND)
            time.sleep(0.05)
        elapsed = time.monotonic() - session_start
        ran_before += elapsed
        session = Session(injected, controller.returncode, round(elapsed, 1))
        record.sessions.append(session)
        if killed:  # Snakemake's lock outlives a controller killed with -9
            record.unlocks += 1
            if "--workflow-profile" in launch:  # its Slurm jobs run on: cancel them (README, "Slurm")
                cancel_slurm_jobs(workdir)
            run_snakemake(workdir, launch, "campaign", "--unlock", log="controller.log")
        session.jobs_left = dry_run_jobs(workdir, launch)  # exit 0 is complete only if nothing is left
        if controller.returncode == 0 and session.jobs_left == 0:  # faults not yet injected are left out
            break
    wait_for_no_trainers(workdir, timeout=120)  # orphans of a killed controller finish their run
    record.seconds = round(time.monotonic() - started, 1)
    return record
