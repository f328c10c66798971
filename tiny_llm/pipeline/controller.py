"""The Snakemake controller process itself: how it stops on SIGTERM, what it says when a run fails, and its
closing summary when a run ends (where to look)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from tiny_llm import campaign as campaign_lib
from tiny_llm.campaign.ranking import final_bpb
from tiny_llm.io import acquire_lock
from tiny_llm.pipeline.export import ExportPlan
from tiny_llm.pipeline.layout import (
    ANALYSIS_ALIGNMENT,
    ANALYSIS_SUMMARY,
    EXPORT_BEST,
    EXPORT_RUN,
    EXPORTS_DIR,
    EXPORTS_SAMPLES,
    FIT_CURVES,
    FIT_TABLE,
    HORIZONS_PLOT,
    HORIZONS_TABLE,
    NOISE_PLOT,
    NOISE_TABLE,
    PACKED_BENCH_SUMMARY,
    PACKED_REPORT,
    RUN_DIR,
    RUN_RESULT,
    RUNS_REPORT,
    THROUGHPUT_PLOT,
    THROUGHPUT_TABLE,
    fill,
)
from tiny_llm.runtime.forkserver import FORK_SERVER_ENV
from tiny_llm.runtime.forkserver import supported as forkserver_supported

if TYPE_CHECKING:
    from tiny_llm.pipeline.plan import WorkflowPlan

STOPPED_BY: list[int] = []
"""Signals that stopped this controller (set by the SIGTERM handler; read by the closing lines)."""
CONTROLLER_LOCK = Path(".snakemake/tiny-llm-controller.lock")
"""Held by the one controller of a workflow directory (relative to it), for as long as it runs."""
_HELD: list[int] = []
"""The fd of the controller lock this process holds (never closed: the process's exit releases it)."""
FAILED_LOGS: list[str] = []
"""The log files of the jobs that failed in this controller (recorded by ``FailedJobRecorder``)."""
SNAKEMAKE_LOGGER = "snakemake.logging"
"""The logger Snakemake reports a failed job on (a record with event "job_error" and its log files)."""


class FailedJobRecorder(logging.Handler):
    """Notes each failed job's log files as Snakemake reports them, before any filter of its handlers:
    ``quiet: [rules]`` keeps the "Error in rule" block out of the console and of Snakemake's own log."""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(getattr(record, "event", None), "value", None) == "job_error":
            FAILED_LOGS.extend(str(path) for path in getattr(record, "log", None) or ())


def record_failed_jobs() -> None:
    """Install one ``FailedJobRecorder`` on Snakemake's logger (after it set up its own handlers)."""
    logger = logging.getLogger(SNAKEMAKE_LOGGER)
    if not any(isinstance(handler, FailedJobRecorder) for handler in logger.handlers):
        logger.addHandler(FailedJobRecorder())


def become_the_controller(directory: Path) -> None:
    """Take the controller lock of ``directory`` for the rest of this process, or fail with one line naming
    the controller that holds it.

    A flock, like the run and cache locks: the kernel drops it when its holder dies, even by kill -9, so
    unlike Snakemake's own lock files (.snakemake/locks) it never outlives a controller.
    """
    if _HELD:
        return
    path = directory / CONTROLLER_LOCK
    holder = lock_holder(path)
    busy = (
        f"another snakemake controller{holder} is running in {directory}; wait for it to end, or stop it "
        "(Ctrl-C or kill: its jobs save their state), then rerun"
    )
    _HELD.append(acquire_lock(path, f"the workflow directory {directory}", busy=busy))


def lock_holder(path: Path) -> str:
    """ " (pid N on HOST)" from a lock file's note of its holder (tiny_llm.io.note_lock_holder), else ""."""
    try:
        host, pid = path.read_text(encoding="utf-8", errors="replace").split()
    except (OSError, ValueError):
        return ""
    return f" (pid {pid} on {host})"


def stale_snakemake_lock(directory: Path) -> str:
    """What to do about Snakemake's lock files while this controller holds the controller lock: they were
    left by one that died (kill -9, a rebooted login node), or that runs on a host sharing no locks with
    this one."""
    return (
        f"{directory} holds Snakemake's lock of a controller that is no longer running (killed?); if no "
        "snakemake runs there, run `snakemake --unlock` with the same options, then this command again"
    )


def interrupt_on_sigterm(forward_to_jobs: bool) -> None:
    """Make SIGTERM (and SIGINT) act like Ctrl-C: stop scheduling, stop the running jobs, exit non-zero.

    Snakemake's own SIGTERM handler waits for every running job to finish (hours for a training job), and a
    controller started in the background by a script ignores SIGINT. Locally (``forward_to_jobs``) the jobs
    get SIGTERM too, as a terminal's Ctrl-C would send them SIGINT: trainers save their state and stop. On a
    cluster Snakemake cancels its jobs itself, and the scheduler sends them the signal.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        STOPPED_BY.append(signum)
        if forward_to_jobs:
            signal_descendants(signal.SIGTERM)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # SIGINT sent to the controller alone (`kill -INT`, or under nohup where it was ignored) reaches no job,
    # unlike a terminal's Ctrl-C, which the whole process group gets: forward it the same way.
    signal.signal(signal.SIGINT, handler)


def signal_descendants(signum: int) -> None:
    """Send ``signum`` to every process this one started (jobs and their own children). The fork server's
    jobs get it from their clients, which are among these: once, as a job the shell started would."""
    import psutil  # a Snakemake dependency: this only runs inside the controller

    served = set()
    for server in FORK_SERVERS:
        with contextlib.suppress(psutil.Error):
            served |= {server.pid, *(p.pid for p in psutil.Process(server.pid).children(recursive=True))}
    for child in psutil.Process().children(recursive=True):
        if child.pid not in served:
            with contextlib.suppress(psutil.Error):  # already gone
                child.send_signal(signum)


FORK_SERVER_PREFIX = "tiny-llm-forks-"
"""The fork server's private directory in the system temp directory: tiny-llm-forks-XXXXXXXX/socket."""
FORK_SERVER_START_S = 120.0
"""How long the controller waits for its fork server to listen; jobs started without one run on their own."""
FORK_SERVERS: list[subprocess.Popen[bytes]] = []
"""This controller's fork server (tiny_llm.runtime.forkserver), while it runs."""


def start_fork_server(log: str) -> None:
    """Start a fork server for this local run's jobs (each then skips importing torch); its record of every
    job goes to ``log``. Jobs that start before it listens, and every job off Linux, run on their own."""
    if not forkserver_supported() or FORK_SERVERS:
        return
    remove_dead_fork_servers()
    socket_path = os.path.join(tempfile.mkdtemp(prefix=FORK_SERVER_PREFIX), "socket")  # a 0700 directory
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as records:
        command = [sys.executable, "-P", "-m", "tiny_llm", "fork-server", "--socket", socket_path]
        command += ["--parent", str(os.getpid())]
        FORK_SERVERS.append(
            subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=records, stderr=subprocess.STDOUT)
        )
    os.environ[FORK_SERVER_ENV] = socket_path
    # Jobs start once it listens (it imports torch first, about 3 s): none then spends that time itself.
    deadline = time.monotonic() + FORK_SERVER_START_S
    while not os.path.exists(socket_path) and FORK_SERVERS[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)


def remove_dead_fork_servers(temp_dir: str | None = None) -> list[Path]:
    """Remove this user's fork-server directories whose socket no server listens on (a run killed with
    SIGKILL leaves its own behind); a server that is starting has no socket yet and is left alone."""
    removed = []
    for directory in Path(temp_dir or tempfile.gettempdir()).glob(f"{FORK_SERVER_PREFIX}*"):
        sock = directory / "socket"
        with contextlib.suppress(OSError):
            if directory.is_symlink() or directory.stat().st_uid != os.getuid() or not sock.is_socket():
                continue
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(sock))
                continue  # a live server (another run's)
            except ConnectionRefusedError:
                pass
            finally:
                probe.close()
            sock.unlink()
            directory.rmdir()
            removed.append(directory)
    return removed


def stop_fork_server(timeout: float = 60.0) -> None:
    """Stop the fork server once its jobs have ended (waiting at most ``timeout`` s: it ends them on its
    own, and its CPU time joins this process's children's)."""
    os.environ.pop(FORK_SERVER_ENV, None)
    while FORK_SERVERS:
        server = FORK_SERVERS.pop()
        server.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout)


def failed_job_logs(snakemake_log: str) -> list[str]:
    """The log files of the jobs that failed, from Snakemake's own log (its "Error in rule" blocks)."""
    logs, in_error = [], False
    for line in snakemake_log.splitlines():
        if line.startswith("Error in rule"):
            in_error = True
        elif in_error and line.strip().startswith("log:"):
            logs.append(line.split("log:", 1)[1].split("(check log")[0].strip())
            in_error = False
    return list(dict.fromkeys(logs))


def failed_job_logs_in(snakemake_logs: str | list[str]) -> list[str]:
    """``failed_job_logs`` of Snakemake's log file(s), as its onerror hook names them."""
    paths = [snakemake_logs] if isinstance(snakemake_logs, str) else list(snakemake_logs)
    return failed_job_logs(
        "".join(Path(path).read_text(encoding="utf-8", errors="replace") for path in paths)
    )


def closing_lines_on_error(snakemake_logs: str | list[str] | None) -> list[str]:
    """What the controller says when a run ends in failure or was stopped."""
    rerun = "rerun the same command: finished work is kept, interrupted runs resume from their saved state."
    if STOPPED_BY:
        name = signal.Signals(STOPPED_BY[0]).name
        return [f"Stopped by {name}; running jobs saved their state. To go on, {rerun}"]
    failed = FAILED_LOGS + (failed_job_logs_in(snakemake_logs) if snakemake_logs else [])
    failed = list(dict.fromkeys(failed))
    if not failed:
        return [f"To go on, {rerun}"]
    errors = [f"  {path}: {line}" for path in failed if (line := error_line(Path(path)))]
    return [f"Failed job log(s): {', '.join(failed)}", *errors, f"Fix the cause, then {rerun}"]


def error_line(log: Path) -> str:
    """A failed job's one-line error: the last ``error:`` line of its log, else its last line ("" if none)."""
    try:
        lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1]


def unbuilt_files(jobs: Iterable[Any]) -> list[str]:
    """The files a finished run's DAG should have built and did not: every job's outputs, and the inputs of
    target rules (which have no outputs of their own). ``jobs``: Snakemake's jobs (``.output``, ``.input``,
    ``.is_norun``), duck-typed so that this module needs no Snakemake."""
    missing: dict[str, None] = {}
    for job in jobs:
        for path in job.input if job.is_norun else job.output:
            if not os.path.exists(str(path)):
                missing[str(path)] = None
    return sorted(missing)


def unbuilt_line(missing: list[str]) -> str:
    """What a controller that ran without error says when files its targets need are still missing."""
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return (
        f"error: the run ended without building {missing[0]}{more}, which the requested targets need; rerun "
        "the same command to build them (`snakemake -n` with the same options lists what is left)"
    )


# ----------------------------------------------------------------------------- the closing summary


def where_to_look(plan: WorkflowPlan) -> list[str]:
    """The finished results a user looks at first, one line per stage that has them."""
    picks = {
        "runs": RUNS_REPORT.first_look(),
        "tuning": plan.tuning.targets(),
        "campaign": [plan.campaign.paths.report.table] if plan.campaign.config else [],
        "packed": [PACKED_REPORT.table, PACKED_BENCH_SUMMARY],
        "export": [EXPORTS_SAMPLES, f"{EXPORTS_DIR}/"],
        "analysis": [
            fill(path, analysed_run=name, settings_tag=plan.analysis.tag)
            for name in plan.analysis.runs
            for path in (ANALYSIS_SUMMARY, ANALYSIS_ALIGNMENT)
        ],
        "horizons": [HORIZONS_TABLE, HORIZONS_PLOT],
        "noise": [NOISE_TABLE, NOISE_PLOT],
        "fit": [FIT_TABLE, FIT_CURVES],
        "throughput": [THROUGHPUT_TABLE, THROUGHPUT_PLOT],
    }
    lines = []
    for stage, files in picks.items():
        present = [path for path in files if Path(path).exists()]
        if present:
            lines.append(f"  {stage:<9} {', '.join(present)}")
    return lines + best_run_lines(plan)


@dataclass(frozen=True)
class FinishedRun:
    """A run with a result: its final loss and bits per byte (None: none), its directory and export's."""

    loss: float | None
    bpb: float | None
    run_dir: str
    export: str


def best_run_lines(plan: WorkflowPlan) -> list[str]:
    """Per size, the finished run of lowest final loss (plain runs and the size's last campaign stage),
    with its loss and its export directory."""
    lines = []
    for size, best in best_runs(plan).items():
        exported = best.export if Path(best.export).is_dir() else "not exported (snakemake export)"
        lines.append(f"  best {size}: {best.run_dir} loss {best.loss:.4f}, export {exported}")
    return lines


def best_runs(plan: WorkflowPlan) -> dict[str, FinishedRun]:
    """Per size, the finished run of lowest final loss (plain runs and the size's last campaign stage)."""
    best: dict[str, FinishedRun] = {}
    for size, run in _finished_runs(plan):
        if run.loss is not None and (size not in best or run.loss < (best[size].loss or 0.0)):
            best[size] = run
    return best


def _finished_runs(plan: WorkflowPlan) -> list[tuple[str, FinishedRun]]:
    """(size, the run) of every run with a result; its loss None where it has no final loss."""
    out = []
    for run, spec in plan.config["runs"].items():
        result = _read_json(Path(fill(RUN_RESULT, run=run)))
        loss = None if result is None else _finite(campaign_lib.final_loss(result))
        bpb = None if result is None else final_bpb(result)
        out.append((spec["size"], FinishedRun(loss, bpb, fill(RUN_DIR, run=run), fill(EXPORT_RUN, run=run))))
    if plan.campaign.config is None:
        return out
    for size, ranking in ExportPlan.best_rankings(plan.campaign).items():
        rows = _read_json(Path(ranking))
        if not isinstance(rows, list) or not rows:
            continue
        top = min(rows, key=lambda row: row.get("rank", 0))
        losses = dict(zip(top.get("runs", []), top.get("run_losses", []), strict=False))
        bpbs = dict(zip(top.get("runs", []), top.get("run_bpb", []), strict=False))
        run_dir = str(Path(ranking).parent / top["run"])
        loss, bpb = _finite(losses.get(top["run"])), _finite(bpbs.get(top["run"]))
        out.append((size, FinishedRun(loss, bpb, run_dir, fill(EXPORT_BEST, size=size))))
    return out


def _read_json(path: Path) -> Any:
    """A finished step's JSON, or None where it is missing or unreadable (the summary skips it)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _finite(value: float | None) -> float | None:
    return value if value is not None and value == value and abs(value) != float("inf") else None
