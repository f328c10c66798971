"""Fault injection: a campaign interrupted at random points, rerun after each fault, ends bitwise where an
uninterrupted one does.

    python benchmarks/faults.py --workdir DIR [--seed 1 ...] [--faults 6] [--shape full|short] [--cores 2]
    python benchmarks/faults.py --executor slurm --workdir DIR --shape short --seeds 1 2 3 4 --faults 8

With ``--executor slurm`` every campaign job goes through profiles/slurm (account and partition of the
cluster `sbatch` talks to, e.g. ../shared/slurm-local; as a Slurm operator, e.g. root there) and the faults
are Slurm's (SLURM_KINDS below); each fault also reports its recovery time, from the fault until every run it
hit trains again. A requeued job is released at once instead of after Slurm's ~120-s hold, except after a
node-down fault. ``--kinds ... kill_slurmd`` adds kill -9 of this machine's slurmd (restarted 20 s
later). The uninterrupted reference is kept in DIR/reference-<executor>.json: more seeds later on the same DIR
compare with the same reference.

A demo-like campaign on the CPU in deterministic mode (toy sizes, one stage-1 learning rate absurd enough to
diverge) is run once without faults (the reference) and once per seed with ``--faults`` faults injected at
random times (seeded). After every fault the same ``snakemake`` command is run again until it succeeds. The
faults, drawn in turn from a seeded shuffle of the kinds:

- ``kill_job``: kill -9 of a random running training process;
- ``sigterm_controller`` / ``sigint_controller``: SIGTERM / SIGINT to the Snakemake controller alone;
- ``kill_controller``: kill -9 of the controller (its jobs are orphaned and run on), then
  `snakemake --unlock`;
- ``truncate_latest``: the ``latest.pt`` of a random interrupted run (unfinished, no trainer on it) cut to a
  random length, during a session or between two.

Then every run's final weights (sha256 of final.safetensors), result.json, metrics.jsonl and best.json, every
stage ranking, the report's comparison.json and selected recipes are compared with the reference's: they
must be identical, except the fields that measure time and memory (which no two runs share). Prints one JSON
object: per seed the faults injected (with their recovery times), the reruns needed and the differences found
(goal 0).

The data stage (corpus, tokenizer, token cache) is built once and copied into every campaign directory, so
only the campaign is interrupted. Scratch directories live under --workdir; the repository's results/ are
untouched.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
KINDS = ("kill_job", "sigterm_controller", "sigint_controller", "kill_controller", "truncate_latest")
SLURM_KINDS = ("scancel", "time_limit", "requeue", "node_down", "kill_controller")
"""Faults of ``--executor slurm``: `scancel` of a training job, its time limit cut to what it has run,
`scontrol requeue` (as preemption does), its node set DOWN (then resumed), kill -9 of the controller (then its
jobs are cancelled, as the README says, and `--unlock`)."""
SLURMD_KIND = "kill_slurmd"
"""Opt-in (``--kinds``): kill -9 of the slurmd of the node running a training job, this machine's (a local
cluster, as root), restarted ``SLURMD_DOWN_SECONDS`` later with its own command line. Its jobs run on."""
SLURMD_DOWN_SECONDS = 20.0
TIMING_KEYS = {
    "tokens_per_second",
    "training_seconds",
    "cumulative_training_seconds",
    "elapsed_tokens_per_second",
    "peak_memory_bytes",
    "evaluation_peak_memory_bytes",
    "seconds",
    "mfu",
    "seconds_this_session",
    "training_elapsed_seconds",
    "training_tokens_per_second",
    "median_tokens_per_second",
    "evaluation_tokens_per_second",
}
"""Fields that measure time or memory: they differ between any two runs, interrupted or not."""
DIVERGING_LR = 100.0
"""Stage 1's absurd learning rate: its runs stop on a non-finite gradient norm mid-run and rank last."""


def campaign_config(shape: str) -> dict[str, Any]:
    """Toy sizes (the `tiny` preset, 2-4 layers), deterministic CPU training, rolling states every 4 updates.

    ``full``: 6 -> 4 -> 2 runs like the demo, two of stage 1's six diverging; ``short``: 2 -> 2, one of
    stage 1's two diverging.
    """
    size = {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}
    budget = {"tokens_per_parameter": 0.25, "epoch_tokens_per_parameter": 0.0625}
    if shape == "full":
        stages = [
            {"size": "t-s", "lr": [1e-3, 3e-3, DIVERGING_LR], "weight_decay": [0.0, 0.1]},
            {"size": "t-m", "parents": 2, "beta2": [0.95, 0.99]},
            {"size": "t-l", "parents": 2},
        ]
    else:
        stages = [
            {"size": "t-s", "lr": [3e-3, DIVERGING_LR], "weight_decay": [0.1]},
            {"size": "t-m", "parents": 1, "beta2": [0.95, 0.99]},
        ]
    sizes = {
        "t-s": {**size, "overrides": {"training": budget}},
        "t-m": {**size, "overrides": {"model": {"num_layers": 3}, "training": budget}},
        "t-l": {**size, "overrides": {"model": {"num_layers": 4}, "training": budget}},
    }
    return {
        "data": {
            "corpus": "embedded",
            "validation_fraction": 0.05,
            "tokenizer": "train",
            "prepare_validation_tokens": 8192,
        },
        "sizes": {name: sizes[name] for name in dict.fromkeys(s["size"] for s in stages)},
        "recipe_defaults": {"training": {"checkpoint_policy": "interval", "checkpoint_every": 4}},
        "runs": {},
        "campaign": {
            "stages": stages,
            "overrides": {
                "training": {"log_every": 2},
                "evaluation": {"subset_blocks": 8},
                "runtime": {"deterministic": True},
            },
            "throughput": {s["size"]: 20000.0 for s in stages},
        },
    }


# ----------------------------------------------------------------------------- running snakemake


def snakemake_command(workdir: Path, launch: list[str], *args: str) -> list[str]:
    """``launch``: how jobs run, ``["--cores", "2"]`` or ``["--workflow-profile", DIR]`` (Slurm)."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
    cmd += [
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--replace-workflow-config",
    ]
    return [*cmd, *launch, *args]


def _process_options(workdir: Path, out: Any) -> dict[str, Any]:
    """How every snakemake process here runs: in the workdir, output appended to a log, no stdin."""
    streams = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
    return {"cwd": workdir, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}, **streams}


def run_snakemake(workdir: Path, launch: list[str], *args: str, log: str, timeout: float = 1800) -> int:
    with open(workdir / log, "a") as out:
        command = snakemake_command(workdir, launch, *args)
        return subprocess.run(command, timeout=timeout, **_process_options(workdir, out)).returncode


def start_controller(workdir: Path, launch: list[str]) -> subprocess.Popen:
    """The campaign in its own session, so only the signals sent here reach it."""
    out = open(workdir / "controller.log", "a")  # noqa: SIM115 - closed with the process
    command = snakemake_command(workdir, launch, "campaign")
    return subprocess.Popen(command, start_new_session=True, **_process_options(workdir, out))


def trainers(workdir: Path) -> dict[int, Path]:
    """Running training processes of this workdir's campaign (orphans included): pid -> run directory."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        is_trainer = Path(argv[0]).name.startswith("python") and argv[1:4] == ["-m", "tiny_llm", "train"]
        if is_trainer and cwd == str(workdir) and "--config" in argv:
            found[int(entry.name)] = (workdir / argv[argv.index("--config") + 1]).parent
    return found


def is_idle(run_dir: Path) -> bool:
    """No trainer holds the run directory's lock."""
    try:
        fd = os.open(run_dir / ".lock", os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def wait_for_no_trainers(workdir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while trainers(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)


def kill_leftovers(workdir: Path) -> None:
    for pid in trainers(workdir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- Slurm


def _slurm(*command: str) -> str:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout


def claim_workdir(workdir: Path, *, empty: bool = False) -> Path:
    """``workdir`` resolved, created and marked as a benchmark's (tiny-llm's ``.tiny-llm-output``), and with
    ``empty`` emptied; a non-empty directory without the marker is refused in one line (``error: ...``, exit
    2) before anything in it is touched: a benchmark deletes nothing of yours."""
    from tiny_llm.errors import TinyLLMError
    from tiny_llm.io import claim_output_dir

    try:
        workdir = claim_output_dir(workdir.resolve(), "--workdir")
    except TinyLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if empty:
        shutil.rmtree(workdir)
        claim_output_dir(workdir, "--workdir")
    return workdir


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


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


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


# ----------------------------------------------------------------------------- faults


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
                    retry_at = now + 0.5
                    continue
                session = len(record.sessions) + 1
                record.faults.append(Fault(kind, session, round(now - session_start, 2), target, runs, wall))
                injected += 1
                killed = killed or kind == "kill_controller"
            time.sleep(0.05)
        elapsed = time.monotonic() - session_start
        ran_before += elapsed
        record.sessions.append(Session(injected, controller.returncode, round(elapsed, 1)))
        if killed:  # Snakemake's lock outlives a controller killed with -9
            record.unlocks += 1
            if "--workflow-profile" in launch:  # its Slurm jobs run on: cancel them (README, "Slurm")
                cancel_slurm_jobs(workdir)
            run_snakemake(workdir, launch, "campaign", "--unlock", log="controller.log")
        if controller.returncode == 0:  # complete (faults not injected by then are left out)
            break
    wait_for_no_trainers(workdir, timeout=120)  # orphans of a killed controller finish their run
    record.seconds = round(time.monotonic() - started, 1)
    return record


# ----------------------------------------------------------------------------- comparing outcomes


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _json(path: Path) -> Any:
    return _strip(json.loads(path.read_text())) if path.is_file() else None


def _metrics(path: Path) -> Any:
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return hashlib.sha256(json.dumps(_strip(rows), sort_keys=True).encode()).hexdigest()


def fingerprint(workdir: Path) -> dict[str, Any]:
    """Everything the campaign decided, minus what measures time and memory."""
    root = workdir / "results/campaign"
    out: dict[str, Any] = {}
    for run in sorted(p.parent for p in root.glob("stage*/*/recipe.yaml")):
        name = str(run.relative_to(root))
        out[f"{name}/final.safetensors"] = _sha256(run / "final.safetensors")
        out[f"{name}/result.json"] = _json(run / "result.json")
        out[f"{name}/best.json"] = _json(run / "best.json")
        out[f"{name}/metrics.jsonl"] = _metrics(run / "metrics.jsonl")
    for ranking in sorted(root.glob("stage*/ranking.json")):
        out[str(ranking.relative_to(root))] = _json(ranking)
    out["report/comparison.json"] = _json(root / "report/comparison.json")
    for selected in sorted(root.glob("report/selected-*.yaml")):
        out[str(selected.relative_to(root))] = selected.read_text()
    return out


def differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return [key for key in sorted(set(reference) | set(other)) if reference.get(key) != other.get(key)]


# ----------------------------------------------------------------------------- the benchmark


def prepare_base(workdir: Path, shape: str, cores: int) -> Path:
    """The data stage (corpus, tokenizer, token cache) once, copied into every campaign directory."""
    base = workdir / "base"
    if not (base / "results/data/cache/manifest.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        (base / "config.yaml").write_text(yaml.safe_dump(campaign_config(shape), sort_keys=False))
        if run_snakemake(base, ["--cores", str(cores)], "data", log="data.log"):
            sys.exit(f"data stage failed; see {base / 'data.log'}")
    return base


def fresh_copy(base: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest, symlinks=True)
    return dest


def reference(workdir: Path, base: Path, launch: list[str]) -> tuple[dict[str, Any], float]:
    """The uninterrupted campaign's fingerprint and length; kept in reference.json and reused (a later
    invocation on the same --workdir, e.g. more seeds, compares with the same reference)."""
    saved = workdir / f"reference-{'slurm' if '--workflow-profile' in launch else 'local'}.json"
    if saved.is_file():
        kept = json.loads(saved.read_text())
        return kept["fingerprint"], kept["seconds"]
    ref = fresh_copy(base, workdir / "reference")
    started = time.monotonic()
    if run_snakemake(ref, launch, "campaign", log="controller.log"):
        sys.exit(f"the uninterrupted campaign failed; see {ref / 'controller.log'}")
    seconds = time.monotonic() - started
    saved.write_text(json.dumps({"fingerprint": fingerprint(ref), "seconds": seconds}))
    return fingerprint(ref), seconds


def run(
    workdir: Path,
    seeds: list[int],
    num_faults: int,
    shape: str = "full",
    cores: int = 2,
    kinds: list[str] | None = None,
    executor: str = "local",
) -> dict[str, Any]:
    """``executor`` "slurm": every Snakemake job through profiles/slurm on the cluster `sbatch` talks to
    (the data stage stays local), with the Slurm fault kinds by default."""
    workdir = claim_workdir(workdir)  # reused: its data stage and reference are kept
    base = prepare_base(workdir, shape, cores)
    slurm = executor == "slurm"
    launch = ["--workflow-profile", str(slurm_profile(workdir))] if slurm else ["--cores", str(cores)]
    all_kinds = SLURM_KINDS if slurm else KINDS
    drawn = dict.fromkeys([*all_kinds, *(kinds or [])])
    expected, ref_seconds = reference(workdir, base, launch)
    # every fault falls well inside the uninterrupted campaign's length (the clock stops between sessions,
    # while the orphans of a killed controller may still finish work)
    span = (0.1 * ref_seconds, 0.7 * ref_seconds)
    results = []
    for seed in seeds:
        target = fresh_copy(base, workdir / f"faults-seed{seed}")
        try:
            record = run_with_faults(target, seed, num_faults, span, launch, list(kinds or all_kinds))
        finally:
            if slurm:
                cancel_slurm_jobs(target)
            kill_leftovers(target)
        found = fingerprint(target)
        diff = differences(expected, found)
        corrupt = sorted(str(p.relative_to(target)) for p in target.glob("results/campaign/*/*/*.corrupt"))
        results.append(
            {
                "seed": seed,
                "seconds": record.seconds,
                "reruns": record.reruns,
                "unlocks": record.unlocks,
                "failed_sessions_without_a_fault": sum(
                    1 for x in record.sessions if x.returncode != 0 and x.faults == 0
                ),
                "faults_injected": len(record.faults),
                "faults_planned_at_seconds": record.planned_seconds,
                "faults_by_kind": {k: sum(f.kind == k for f in record.faults) for k in drawn},
                "faults": [
                    {**asdict(f), "recovery_seconds": recovery_seconds(target, f)} for f in record.faults
                ],
                "sessions": [asdict(x) for x in record.sessions],
                "damaged_states_set_aside": corrupt,
                "runs_compared": sum(key.endswith("/final.safetensors") for key in expected),
                "differences": diff,
            }
        )
    return {
        "shape": shape,
        "executor": executor,
        "cores": cores,
        "reference_seconds": round(ref_seconds, 1),
        "fault_span_seconds": [round(s, 1) for s in span],
        "seeds": results,
        "total_faults": sum(r["faults_injected"] for r in results),
        "total_reruns": sum(r["reruns"] for r in results),
        "total_differences": sum(len(r["differences"]) for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir",
        type=Path,
        required=True,
        help="scratch directory, new or one of an earlier run (reused for the data)",
    )
    parser.add_argument(
        "--seed", type=int, action="append", help="seed of the faults (repeatable; default 1)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[], help="several seeds at once")
    parser.add_argument("--faults", type=int, default=6, help="faults per seed")
    parser.add_argument("--shape", choices=("full", "short"), default="full")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--executor", choices=("local", "slurm"), default="local")
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=sorted({*KINDS, *SLURM_KINDS, SLURMD_KIND}),
        help="fault kinds to draw from (default: all of the executor's)",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    seeds = [*(args.seed or []), *args.seeds] or [1]
    report = run(
        args.workdir, seeds, args.faults, args.shape, args.cores, kinds=args.kinds, executor=args.executor
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0 if report["total_differences"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
