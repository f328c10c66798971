"""The fault benchmark's Snakemake driver: the campaign's controller and the training processes it starts."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

from snakemake_driver import snakemake_command as repository_snakemake

LOCAL_JOB_COMMANDS = (
    ["campaign", "plan"],
    ["campaign", "select"],
    ["campaign", "rank"],
    ["report"],
    ["tune", "select"],
)
"""The campaign's local jobs (they run beside the controller, on Slurm too), by their command's words."""
LOCAL_JOB_KIND = "kill_controller_in_local_job"
"""kill -9 of the controller while one of its local jobs (plan, select, rank, report) runs, the job left to
finish as an orphan, then `--unlock`: the kind of fault that once let a rerun exit 0 with the campaign
unfinished (Snakemake skipped every job after the rerun local job's outputs)."""


def snakemake_command(workdir: Path, launch: list[str], *args: str) -> list[str]:
    """``launch``: how jobs run, ``["--cores", "2"]`` or ``["--workflow-profile", DIR]`` (Slurm)."""
    return repository_snakemake(workdir, *launch, *args, configfile=workdir / "config.yaml")


def _process_options(workdir: Path, out: Any) -> dict[str, Any]:
    """How every snakemake process here runs: in the workdir, output appended to a log, no stdin."""
    streams = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
    return {"cwd": workdir, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}, **streams}


def run_snakemake(workdir: Path, launch: list[str], *args: str, log: str, timeout: float = 1800) -> int:
    with open(workdir / log, "a") as out:
        command = snakemake_command(workdir, launch, *args)
        return subprocess.run(command, timeout=timeout, **_process_options(workdir, out)).returncode


def dry_run_jobs(workdir: Path, launch: list[str]) -> int:
    """How many jobs `snakemake -n campaign` lists (0: nothing to be done), or -1 when it failed."""
    command = snakemake_command(workdir, launch, "campaign", "-n")
    proc = subprocess.run(command, text=True, timeout=600, **_process_options(workdir, subprocess.PIPE))
    out = proc.stdout
    if proc.returncode != 0:
        return -1
    if "Nothing to be done" in out:
        return 0
    totals = [line.split()[1] for line in out.splitlines() if line.startswith("total ")]
    return int(totals[0]) if totals else -1


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


def served_job(workdir: Path, pid: int) -> int:
    """The process running the command of ``pid``: the job the fork server forked for it (the server's
    record in ``logs/fork-server.jsonl``), else ``pid`` itself. Ask once the job has started working."""
    try:
        lines = (workdir / "logs" / "fork-server.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return pid
    started = {r["client"]: r["started"] for r in map(json.loads, lines) if "started" in r}
    return started.get(pid, pid)


def local_jobs(workdir: Path, words: list[str]) -> list[int]:
    """Running ``python -m tiny_llm <words> ...`` processes of this workdir (a local job of the campaign:
    ``campaign plan``, ``campaign select``, ``report``, ``tune select`` ...), orphans included."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        command = argv[1:3] == ["-m", "tiny_llm"] and argv[3 : 3 + len(words)] == words
        if command and Path(argv[0]).name.startswith("python") and cwd == str(workdir):
            found.append(int(entry.name))
    return sorted(found)


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z, ...), or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def wait_for_exit(pid: int) -> None:
    """Until ``pid`` has exited (gone, or a zombie nobody reaps: an orphan's end)."""
    while _state(pid) not in ("", "Z"):
        time.sleep(0.02)


def signal_reached(pid: int, signum: int) -> bool:
    """Whether ``signum`` has reached the process ``pid``, which the caller stopped (SIGSTOP): the signal is
    pending, or the process runs again or is gone (Slurm sends SIGCONT with a signal to a job step)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    fields = dict(line.split(":", 1) for line in status.splitlines())
    pending = (int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)) >> (signum - 1) & 1
    return bool(pending) or fields["State"].split()[0] not in ("T", "t")


def wait_until(predicate: Any, timeout: float) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def kill_controller_during(controller: subprocess.Popen, workdir: Path, words: list[str]) -> int | None:
    """kill -9 of the controller while one of its local jobs (``local_jobs(workdir, words)``) runs, then that
    job left to finish as an orphan. The job is paused (SIGSTOP) as soon as its process exists, so the
    controller dies while the job has not ended whatever the machine's load; the job's pid once it has
    exited, or None when the controller ended before such a job started."""
    while controller.poll() is None:
        for pid in local_jobs(workdir, words):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            if _state(pid) != "T":  # ended before it could be paused: wait for the next such job
                continue
            controller.kill()
            controller.wait()
            os.kill(pid, signal.SIGCONT)
            wait_for_exit(pid)
            return pid
        time.sleep(0.01)
    return None


def kill_controller_during_write(controller: subprocess.Popen, workdir: Path, written: str, log: str) -> bool:
    """kill -9 of the controller while one of its in-thread jobs (a plan file's, with no process to wait on)
    runs: the job's ``log`` is kept a FIFO, whose opening blocks the job once it has written ``written``.
    Snakemake removes a job's old log just before the job runs, so the FIFO is made again whenever it is
    gone; the kill comes once ``written`` exists with the FIFO in place (the job is then held before its
    log and everything after it). False when the controller ended first, or the job got past the FIFO."""
    fifo = workdir / log
    fifo.parent.mkdir(parents=True, exist_ok=True)
    fifo.unlink(missing_ok=True)  # an earlier job's log (the job writes it anew)
    try:
        while controller.poll() is None:
            with contextlib.suppress(FileExistsError):  # ours, or the job's own log when it got past
                os.mkfifo(fifo)
            if (workdir / written).exists():
                held = stat.S_ISFIFO(fifo.stat().st_mode)
                controller.kill()
                controller.wait()
                return held
            time.sleep(0.001)
        return False
    finally:
        fifo.unlink(missing_ok=True)


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
