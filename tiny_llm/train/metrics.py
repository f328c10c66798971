"""The two files a run writes as it goes: metrics.jsonl (``MetricsLog``, read by ``read_metrics``) and run.log
(``RunLog``, also the console's: on a terminal, train rows move a bar)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_llm.io import append_jsonl, atomic_write_text, is_disk_full
from tiny_llm.terminal import TrainBar, on_terminal
from tiny_llm.train.rows import format_duration

RESUMABLE_EVENTS = ("train", "validation")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: what no writer here makes
        raise ValueError(f"non-finite number {text}")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl ([] if there is none); a line that is not a JSON object, or that holds
    NaN or an infinity (which the writer refuses, so no run wrote it), is skipped.

    Rows are appended one line at a time, so a bad line is one torn by a killed process or a full disk, or one
    damaged later: only that line is lost, never the rows after it (resuming rewrites the file without it).
    """
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line, parse_constant=_no_constant, parse_float=_finite)
        except ValueError:  # JSONDecodeError, a non-finite number, an integer of too many digits
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class MetricsLog:
    """Append-only JSON lines; on resume cut back to the rows the resumed state had produced.

    ``listener`` also gets every appended row (live tracking).
    """

    def __init__(self, path: Path, listener: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self.listener = listener

    def rows(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def truncate_to_step(self, step: int) -> None:
        """Keep train/validation rows at or before ``step`` so a resumed file equals an uninterrupted one."""
        kept = [r for r in self.rows() if r.get("event") in RESUMABLE_EVENTS and r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))

    def reset(self) -> None:
        atomic_write_text(self.path, "")

    def append(self, row: dict[str, Any]) -> None:
        append_jsonl(self.path, row)
        if self.listener is not None:
            self.listener(row)


class RunLog:
    """Human-readable lines to the console and run.log; on a terminal, train rows move a bar instead."""

    def __init__(self, path: Path, quiet: bool = False) -> None:
        self.path = path
        self.quiet = quiet
        self.bar: TrainBar | None = None

    def start_bar(self, total_tokens: int, done_tokens: int, num_updates: int) -> None:
        """Draw train rows as a progress bar where the console is a terminal (lines stay in run.log)."""
        if not self.quiet and on_terminal() and sys.stdout.isatty():
            self.bar = TrainBar(total_tokens, done_tokens, num_updates)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __call__(self, message: str, row: dict[str, Any] | None = None, eta: float = float("nan")) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(f"{stamp} {message}\n")
        except OSError as exc:  # a full disk: the console still gets the line
            if not is_disk_full(exc):
                raise
        if self.quiet:
            return
        if self.bar is None:
            print(message, file=sys.stdout, flush=True)
        elif row is not None:
            self.bar.row(row, format_duration(eta))
        else:
            self.bar.write(message)
