"""metrics.jsonl, run.log and the console progress line."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tiny_llm.io import append_jsonl, atomic_write_text, is_disk_full

RESUMABLE_EVENTS = ("train", "validation")


class MetricsLog:
    """Append-only JSON lines; on resume cut back to the rows the resumed state had produced."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line (a killed writer, a full disk) or one damaged later: only it is lost
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def truncate_to_step(self, step: int) -> None:
        """Keep train/validation rows at or before ``step`` so a resumed file equals an uninterrupted one."""
        kept = [r for r in self.rows() if r.get("event") in RESUMABLE_EVENTS and r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))

    def reset(self) -> None:
        atomic_write_text(self.path, "")

    def append(self, row: dict[str, Any]) -> None:
        append_jsonl(self.path, row)


class RunLog:
    """Human-readable lines to the console and run.log."""

    def __init__(self, path: Path, quiet: bool = False) -> None:
        self.path = path
        self.quiet = quiet

    def __call__(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(f"{stamp} {message}\n")
        except OSError as exc:  # a full disk: the console still gets the line
            if not is_disk_full(exc):
                raise
        if not self.quiet:
            print(message, file=sys.stdout, flush=True)


@dataclass
class Window:
    """Accumulators between two train rows (persisted in the state so resumed rows match)."""

    loss_sum: float = 0.0
    tokens: int = 0
    seconds: float = 0.0
    grad_norm_sum: float = 0.0
    updates: int = 0

    def add(self, loss: float, tokens: int, seconds: float, grad_norm: float) -> None:
        self.loss_sum += loss * tokens
        self.tokens += tokens
        self.seconds += seconds
        self.grad_norm_sum += grad_norm
        self.updates += 1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def format_tokens(tokens: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.2f}{unit}"
    return str(int(tokens))


def console_line(row: dict[str, Any], num_epochs: int, num_updates: int, eta_seconds: float) -> str:
    return (
        f"epoch {row['epoch']}/{num_epochs} step {row['step']}/{num_updates} "
        f"tokens {format_tokens(row['tokens'])} loss {row['loss']:.4f} lr {row['lr']:.3e} "
        f"gnorm {row['grad_norm']:.3f} tok/s {row['tokens_per_second']:,.0f} "
        f"ETA {format_duration(eta_seconds)}"
    )
