"""Progress bars on a terminal; plain lines where output goes to a file (Snakemake and Slurm logs).

A bar is drawn only when stderr is a terminal and ``$TINY_LLM_PROGRESS`` is not ``lines``; otherwise
every function here leaves the output as it was.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

PROGRESS_ENV = "TINY_LLM_PROGRESS"
T = TypeVar("T")


def on_terminal() -> bool:
    """Whether progress bars are drawn (stderr is a terminal, and they are not turned off)."""
    if os.environ.get(PROGRESS_ENV, "auto") == "lines":
        return False
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def counted(items: Iterable[T], *, total: int | None, desc: str, unit: str) -> Iterator[T]:
    """``items``, counted by a bar on a terminal (and nothing more elsewhere)."""
    if not on_terminal():
        yield from items
        return
    from tqdm import tqdm

    with tqdm(items, total=total, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr) as bar:
        yield from bar


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int | None, *, desc: str, unit: str) -> Any:
    """A bar to ``update(n)`` and ``close()`` on a terminal; elsewhere one that does nothing."""
    if not on_terminal():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr)


class TrainBar:
    """The training run's bar: tokens of the budget, loss, tokens/s and the ETA, updated at each train row."""

    def __init__(self, total_tokens: int, done_tokens: int, num_updates: int) -> None:
        from tqdm import tqdm

        self.num_updates = num_updates
        self.bar = tqdm(
            total=total_tokens,
            initial=done_tokens,
            unit="tok",
            unit_scale=True,
            dynamic_ncols=True,
            file=sys.stderr,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} tokens [{elapsed}] {postfix}",
            desc="train",
        )

    def row(self, row: dict[str, Any], eta: str) -> None:
        self.bar.update(row["tokens"] - self.bar.n)
        self.bar.set_postfix_str(
            f"step {row['step']}/{self.num_updates} loss {row['loss']:.4f} "
            f"{row['tokens_per_second']:,.0f} tok/s ETA {eta}"
        )

    def write(self, message: str) -> None:
        """A line above the bar."""
        self.bar.write(message, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()
