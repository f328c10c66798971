"""Progress: a bar when the console is a terminal, the usual lines when output goes to a log file."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import io
import os
import pty
import struct
import termios
import threading
from pathlib import Path

import pytest
from train_helpers import cli_sets

from tiny_llm.cli import main
from tiny_llm.terminal import PROGRESS_ENV, counted, on_terminal, progress_bar


def drain(master: int, chunks: list[bytes]) -> None:
    """Read the terminal until every writer has closed it (EIO)."""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            return
        if not data:
            return
        chunks.append(data)


def on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """The command line ``argv`` run in this process with stdout and stderr on a pseudo-terminal (what the
    commands look at is `sys.stderr` and `sys.stdout`); (exit code, everything it drew)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # 40 rows, 160 columns
    chunks: list[bytes] = []
    reader = threading.Thread(target=drain, args=(master, chunks))
    reader.start()
    try:
        with open(slave, "w", encoding="utf-8") as tty, pytest.MonkeyPatch.context() as patch:
            patch.delenv(PROGRESS_ENV, raising=False)
            with contextlib.redirect_stdout(tty), contextlib.redirect_stderr(tty):
                code = main(argv)
    finally:
        reader.join()  # the slave is closed: the reader stops once it has read everything
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def test_train_draws_a_bar_on_a_terminal_and_keeps_lines_in_run_log(tiny_cache, tiny_recipe_args, tmp_path):
    run_dir = tmp_path / "tty"
    code, drawn = on_a_terminal(["train", *cli_sets(tiny_cache, tiny_recipe_args, run_dir)])
    assert code == 0, drawn
    assert "train:" in drawn and "tokens [" in drawn and "tok/s ETA" in drawn and "step 28/28" in drawn
    assert "\r" in drawn  # redrawn in place
    assert "epoch 1/3 step 2/28" not in drawn  # train rows move the bar instead of printing lines
    assert "epoch 1/3 validation loss" in drawn  # other lines still appear, above the bar
    assert "epoch 1/3 step 2/28" in (run_dir / "run.log").read_text()


@dataclasses.dataclass
class ToAFile:
    run_dir: Path
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def trained_to_a_file(tiny_cache, tiny_recipe_args, tmp_path_factory) -> ToAFile:
    """`train` with its output going to files (in this process: neither stream is a terminal); the
    evaluation test reads the run."""
    run_dir = tmp_path_factory.mktemp("progress") / "file"
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(PROGRESS_ENV, raising=False)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["train", *cli_sets(tiny_cache, tiny_recipe_args, run_dir)])
    return ToAFile(run_dir, code, out.getvalue(), err.getvalue())


def test_train_writes_lines_when_output_is_a_file(trained_to_a_file: ToAFile) -> None:
    run = trained_to_a_file
    assert run.code == 0, run.stderr
    assert "epoch 1/3 step 2/28" in run.stdout and "tok/s" in run.stdout
    assert "\r" not in run.stdout + run.stderr and "tokens [" not in run.stderr


def test_helpers_change_nothing_off_a_terminal(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "lines")
    assert not on_terminal()
    assert list(counted(iter(range(5)), total=5, desc="x", unit="y")) == [0, 1, 2, 3, 4]
    bar = progress_bar(3, desc="x", unit="y")
    bar.update(2)
    bar.close()
    assert type(bar).__name__ == "_NoBar"


def test_evaluate_full_draws_a_bar_on_a_terminal(trained_to_a_file: ToAFile) -> None:
    run_dir = trained_to_a_file.run_dir
    assert trained_to_a_file.code == 0, trained_to_a_file.stderr
    config = ["--config", str(Path(run_dir) / "resolved.yaml")]
    argv = ["evaluate", *config, "--checkpoint", str(run_dir / "final.pt"), "--full"]
    code, drawn = on_a_terminal(argv)
    assert code == 0, drawn
    assert "validation:" in drawn and "batch" in drawn and '"split": "full"' in drawn
