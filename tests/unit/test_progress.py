"""Progress: a bar when the console is a terminal, the usual lines when output goes to a log file."""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from train_helpers import cli_sets

from tiny_llm.progress import PROGRESS_ENV, counted, on_terminal, progress_bar


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_ENV}
    return {**env, **extra}


def on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; (exit code, everything it drew)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40 rows, 160 columns
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=environment())
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError as exc:  # EIO: the child closed the terminal
            if exc.errno != errno.EIO:
                raise
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(), b"".join(chunks).decode(errors="replace")


def test_train_draws_a_bar_on_a_terminal_and_keeps_lines_in_run_log(tiny_cache, tiny_recipe_args, tmp_path):
    run_dir = tmp_path / "tty"
    argv = [sys.executable, "-m", "tiny_llm", "train", *cli_sets(tiny_cache, tiny_recipe_args, run_dir)]
    code, drawn = on_a_terminal(argv)
    assert code == 0, drawn
    assert "train:" in drawn and "tokens [" in drawn and "tok/s ETA" in drawn and "step 28/28" in drawn
    assert "\r" in drawn  # redrawn in place
    assert "epoch 1/3 step 2/28" not in drawn  # train rows move the bar instead of printing lines
    assert "epoch 1/3 validation loss" in drawn  # other lines still appear, above the bar
    assert "epoch 1/3 step 2/28" in (run_dir / "run.log").read_text()


@pytest.fixture(scope="module")
def trained_to_a_file(
    tiny_cache, tiny_recipe_args, tmp_path_factory
) -> tuple[Path, subprocess.CompletedProcess]:
    """`train` with its output going to pipes: (run directory, process); the evaluation test reads the run."""
    run_dir = tmp_path_factory.mktemp("progress") / "file"
    argv = [sys.executable, "-m", "tiny_llm", "train", *cli_sets(tiny_cache, tiny_recipe_args, run_dir)]
    return run_dir, subprocess.run(argv, capture_output=True, text=True, env=environment(), check=False)


def test_train_writes_lines_when_output_is_a_file(trained_to_a_file):
    _, proc = trained_to_a_file
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1/3 step 2/28" in proc.stdout and "tok/s" in proc.stdout
    assert "\r" not in proc.stdout + proc.stderr and "tokens [" not in proc.stderr


def test_helpers_change_nothing_off_a_terminal(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "lines")
    assert not on_terminal()
    assert list(counted(iter(range(5)), total=5, desc="x", unit="y")) == [0, 1, 2, 3, 4]
    bar = progress_bar(3, desc="x", unit="y")
    bar.update(2)
    bar.close()
    assert type(bar).__name__ == "_NoBar"


def test_evaluate_full_draws_a_bar_on_a_terminal(trained_to_a_file):
    run_dir, proc = trained_to_a_file
    assert proc.returncode == 0, proc.stderr
    config = ["--config", str(Path(run_dir) / "resolved.yaml")]
    argv = [sys.executable, "-m", "tiny_llm", "evaluate", *config, "--checkpoint", str(run_dir / "final.pt")]
    code, drawn = on_a_terminal([*argv, "--full"])
    assert code == 0, drawn
    assert "validation:" in drawn and "batch" in drawn and '"split": "full"' in drawn
