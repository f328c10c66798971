"""The Snakemake controller's own behaviour (tiny_llm.pipeline.controller): SIGTERM acts like Ctrl-C, the
closing lines of a failed or stopped run, one controller per workflow directory."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_llm.errors import RunStateError
from tiny_llm.pipeline import controller

SIGTERM_SCRIPT = """
import os, signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup from a script
from tiny_llm.pipeline.controller import interrupt_on_sigterm
job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
interrupt_on_sigterm(forward_to_jobs=True)
try:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
except KeyboardInterrupt:
    print("interrupted", job.wait(timeout=10))
"""


def test_sigterm_interrupts_the_controller_and_stops_its_jobs() -> None:
    proc = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interrupted -15"  # the job got SIGTERM, the controller a KeyboardInterrupt


def test_closing_lines_name_the_failed_logs(tmp_path: Path, monkeypatch) -> None:
    log = tmp_path / "snakemake.log"
    log.write_text(
        "Error in rule train_run:\n    jobid: 4\n"
        "    log: logs/train_run/a.log (check log file(s) for error details)\n"
    )
    lines = controller.closing_lines_on_error([str(log)])
    assert lines[0] == "Failed job log(s): logs/train_run/a.log"
    assert lines[1].startswith("Fix the cause, then rerun the same command")
    assert controller.closing_lines_on_error(None)[0].startswith("To go on, rerun the same command")
    monkeypatch.setattr(controller, "STOPPED_BY", [15])
    assert controller.closing_lines_on_error(str(log))[0].startswith("Stopped by SIGTERM")


def test_sigint_to_the_controller_alone_also_stops_its_jobs() -> None:
    script = SIGTERM_SCRIPT.replace("getpid(), signal.SIGTERM)", "getpid(), signal.SIGINT)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "interrupted -15"


HOLD_SCRIPT = """
import sys
from pathlib import Path
from tiny_llm.pipeline.controller import become_the_controller
become_the_controller(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_second_controller_is_refused_in_one_line_naming_the_first(tmp_path: Path) -> None:
    command = [sys.executable, "-c", HOLD_SCRIPT, str(tmp_path)]
    first = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "held\n"
        with pytest.raises(RunStateError) as refused:
            controller.become_the_controller(tmp_path)
        message = str(refused.value)
        assert "\n" not in message and f"(pid {first.pid} on {socket.gethostname()})" in message
        assert f"is running in {tmp_path}; wait for it to end" in message
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    # its exit released the lock (as kill -9 would): this process is the controller now, and stays it
    controller.become_the_controller(tmp_path)
    controller.become_the_controller(tmp_path)
    assert (tmp_path / controller.CONTROLLER_LOCK).read_text() == f"{socket.gethostname()} {os.getpid()}\n"
    os.close(controller._HELD.pop())


def test_a_dead_fork_servers_directory_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    """A run killed with SIGKILL leaves its fork server's socket; the next run's controller removes it."""
    dead, live, starting = (tmp_path / f"{controller.FORK_SERVER_PREFIX}{name}" for name in ("a", "b", "c"))
    for directory in (dead, live, starting):
        directory.mkdir(mode=0o700)
    (tmp_path / "other").mkdir()
    with socket.socket(socket.AF_UNIX) as was_bound:
        was_bound.bind(str(dead / "socket"))  # closed without a listener: its server is gone
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(live / "socket"))
        listening.listen(1)
        assert controller.remove_dead_fork_servers(str(tmp_path)) == [dead]
    assert not dead.exists() and (live / "socket").exists() and starting.exists()
