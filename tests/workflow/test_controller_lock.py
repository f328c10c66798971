"""One controller per workflow directory: a second `snakemake` started beside a running one stops with one
line naming it (a dry run does not), and the lock a controller killed with -9 leaves behind takes `--unlock`,
said in one line, then the same command completes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from workflow_helpers import snakemake, snakemake_command, snakemake_env, tiny_config, write_config

from tiny_llm.pipeline.controller import CONTROLLER_LOCK
from tiny_llm.pipeline.layout import CORPUS_DIR

pytestmark = pytest.mark.slow


def wait_for(condition: Callable[[], bool], process: subprocess.Popen, what: str) -> None:
    """Until ``condition`` holds; fails at once if ``process`` ended first (the event can no longer come)."""
    deadline = time.monotonic() + 240
    while not condition():
        assert process.poll() is None, f"the first controller ended (exit {process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after 240 s"
        time.sleep(0.05)


def start(workdir: Path, *args: str) -> subprocess.Popen:
    """A controller in its own session (its jobs with it), output in files of the workdir."""
    configfile = workdir / "config.yaml"
    out = open(workdir / "first.out", "w")  # noqa: SIM115 - closed with the process
    err = open(workdir / "first.err", "w")  # noqa: SIM115
    return subprocess.Popen(
        snakemake_command(workdir, configfile, "--cores", "1", *args),
        cwd=workdir,
        stdout=out,
        stderr=err,
        stdin=subprocess.DEVNULL,
        env=snakemake_env(),
        start_new_session=True,
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower() or "exception" in line.lower()]


def test_a_second_controller_refuses_in_one_line_and_the_first_completes(tmp_path: Path) -> None:
    configfile = write_config(tmp_path / "config.yaml", tiny_config())
    go = tmp_path / "go"
    # the first controller holds the directory and waits (Snakemake's --wait-for-files) until the test says go
    first = start(tmp_path, "--wait-for-files", str(go), "--latency-wait", "600", CORPUS_DIR)
    try:
        lock = tmp_path / CONTROLLER_LOCK
        holder = f"{socket.gethostname()} {first.pid}\n"
        wait_for(lambda: lock.is_file() and lock.read_text() == holder, first, "controller lock")

        second = snakemake(tmp_path, configfile, "--cores", "1", CORPUS_DIR)
        assert second.returncode != 0
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        expected = f"error: another snakemake controller (pid {first.pid} on {socket.gethostname()}) is "
        expected += f"running in {tmp_path}; wait for it to end, or stop it"
        assert lines[-1].startswith(expected), second.stderr
        # nothing else but Snakemake's start-up lines, which the first controller printed as well
        first_lines = (tmp_path / "first.err").read_text().splitlines()
        assert all(line in first_lines for line in lines[:-1]), second.stderr
        assert error_lines(second.stderr) == lines[-1:] and not second.stdout.strip(), second

        dry = snakemake(tmp_path, configfile, "-n", CORPUS_DIR)  # a dry run is no controller: not refused
        assert dry.returncode == 0, dry.stderr

        go.touch()
        assert first.wait(timeout=300) == 0, (tmp_path / "first.err").read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert (tmp_path / CORPUS_DIR).is_dir()
    assert not list((tmp_path / ".snakemake").glob("locks/*"))  # Snakemake's own lock released


def test_the_lock_of_a_killed_controller_takes_unlock_said_in_one_line(tmp_path: Path) -> None:
    configfile = write_config(tmp_path / "config.yaml", tiny_config())
    first = start(tmp_path, "data")
    locks = tmp_path / ".snakemake/locks"
    try:
        wait_for(lambda: (tmp_path / "logs/build_corpus").is_dir(), first, "first job")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the controller and its jobs, as a lost login node would
    first.wait(timeout=60)
    assert list(locks.iterdir()), "the killed controller left no lock: nothing tested"

    second = snakemake(tmp_path, configfile, "--cores", "1", "data")
    assert second.returncode != 0
    assert error_lines(second.stderr) == [
        f"error: {tmp_path} holds Snakemake's lock of a controller that is no longer running (killed?); "
        "if no snakemake runs there, run `snakemake --unlock` with the same options, then this command again"
    ], second.stderr
    assert "Traceback" not in second.stderr

    unlock = snakemake(tmp_path, configfile, "--unlock", "data")
    assert unlock.returncode == 0, unlock.stderr
    rerun = snakemake(tmp_path, configfile, "--cores", "1", "data", timeout=400)
    assert rerun.returncode == 0, rerun.stderr
    assert (tmp_path / "results/data/cache/manifest.json").is_file()
