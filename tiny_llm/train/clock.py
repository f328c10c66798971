"""The run's clock: timing windows, device synchronisation, peak memory and the elapsed figures.

The loop tells it what happens, and it keeps time: a session starts (``start_session``), an update starts
and is queued (``update_started``, ``update_queued``), a train row is written (``row``), and work that is
not training runs (``untimed``: a save, an evaluation, the run's end). It is the only code of a run that
synchronises the device for timing or resets its peak memory.

A device queues an update's kernels and returns at once, so the time of one update means nothing on its
own; only a span that starts on an idle device and ends when its last update's kernels are done does. A
span opens (one synchronize) at the first update after a pause and closes (one synchronize) at the next row,
save or evaluation; between two updates of a span nothing waits for the device. The span's seconds go to the
open row window and to the run's training time. The peak memory is reset once per row window, where its
first update starts, and read at its row: a save inside it does not narrow it, but folds its peak so far
into the run's (the state holds it). An evaluation (which follows a row) has a peak of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from tiny_llm.runtime.device import DeviceTimer
from tiny_llm.train.progress import Progress

Untimed = Literal["save", "evaluation", "end"]


@dataclass(frozen=True)
class RowFigures:
    """What the clock says at a train row."""

    peak_memory_bytes: int
    """The row window's peak (its updates' device memory, the peak floor included)."""
    elapsed_tokens_per_second: float
    """Tokens this session / wall time since this session's first update."""
    seconds_per_update: float
    """This session's mean update time over its closed spans (the ETA's rate)."""


@dataclass
class EvaluationPeak:
    """An evaluation's own peak memory, known once it ends."""

    bytes: int = 0


class RunClock:
    """Stamps, counts and divides the figures of ``progress`` (the session's: ``start_session``)."""

    def __init__(self, timer: DeviceTimer, progress: Progress) -> None:
        self.timer = timer
        self.progress = progress
        self.session_start = timer.now()
        """When this session started (``seconds_this_session``); set again by ``start_session``."""
        self.span_start: float | None = None
        """When the open span started (an idle device); None between spans."""
        self.row_window_open = False
        """Whether this session's peak-memory window is open (reset at its first update)."""
        self.first_update_at: float | None = None
        """When this session's first update started."""
        self.elapsed_mark: float | None = None
        """Time up to which ``progress.elapsed_seconds`` is counted; None while the clock is stopped."""
        self.session_tokens = 0
        self.session_updates = 0
        self.session_seconds = 0.0
        """Seconds of this session's closed spans (the ETA's rate)."""
        self.peak_floor: Callable[[], int] = lambda: 0
        """Memory a window holds that the allocator's peak misses (a CUDA graph's replays)."""

    def start_session(self, progress: Progress, peak_floor: Callable[[], int]) -> None:
        """The session starts now, on ``progress`` (fresh or resumed). A validation left pending by an
        interruption belongs to training, so the elapsed time counts from here then."""
        self.progress = progress
        self.peak_floor = peak_floor
        self.session_start = self.timer.now()
        if progress.pending_epoch is not None:
            self.elapsed_mark = self.session_start

    def seconds_this_session(self) -> float:
        return self.timer.now() - self.session_start

    # ------------------------------------------------------------------ updates and rows

    def update_started(self) -> None:
        """Open a span on an idle device if none is open, and the row window's peak with it."""
        if self.span_start is not None:
            return
        self.timer.synchronize()
        if not self.row_window_open:
            self.timer.reset_peak()
            self.row_window_open = True
        self.span_start = self.timer.now()
        if self.first_update_at is None:
            self.first_update_at = self.span_start
        if self.elapsed_mark is None:
            self.elapsed_mark = self.span_start

    def update_queued(self, tokens: int) -> None:
        """Count a queued update (no device wait)."""
        self.session_tokens += tokens
        self.session_updates += 1

    def row(self) -> RowFigures:
        """End the row window (its span first): its peak, folded into the run's, and the session's rates."""
        self._pause()
        peak = self._fold_peak()
        self.row_window_open = False
        return RowFigures(peak, self._elapsed_tokens_per_second(), self._seconds_per_update())

    # ------------------------------------------------------------------ untimed work

    @contextlib.contextmanager
    def untimed(self, what: Untimed = "save") -> Iterator[EvaluationPeak]:
        """Work that is not training: the open span closes first (its kernels are done, so what follows
        reads the device without a wait), and the open row window's peak so far is folded into the run's.

        ``evaluation``: the row window ends there and the evaluation's own peak is measured (yielded, read
        once the block ends) and folded into the run's evaluation peak. ``end``: the elapsed time stops (at
        the final state: the full validation is not in it)."""
        self._pause()
        if what == "end":
            self._tick_elapsed()
            self.elapsed_mark = None
        if self.row_window_open:
            self._fold_peak()
            self.row_window_open = what != "evaluation"
        peak = EvaluationPeak()
        if what == "evaluation":
            self.timer.reset_peak()
        yield peak
        if what == "evaluation":
            peak.bytes = self.timer.peak()
            p = self.progress
            p.evaluation_peak_memory_bytes = max(p.evaluation_peak_memory_bytes or 0, peak.bytes)

    # ------------------------------------------------------------------ inside

    def _pause(self) -> None:
        """Close the open span: wait for its updates' kernels, add its seconds to the window and the run."""
        if self.span_start is None:
            return
        self.timer.synchronize()
        seconds = self.timer.now() - self.span_start
        self.span_start = None
        self.progress.training_seconds += seconds
        self.progress.window.seconds += seconds
        self.session_seconds += seconds
        self._tick_elapsed()

    def _fold_peak(self) -> int:
        """The open row window's peak so far, folded into the run's training peak."""
        peak = max(self.timer.peak(), self.peak_floor())
        self.progress.peak_memory_bytes = max(self.progress.peak_memory_bytes or 0, peak)
        return peak

    def _tick_elapsed(self) -> None:
        """Add the wall time since the last tick to ``progress.elapsed_seconds`` while the clock runs."""
        if self.elapsed_mark is not None:
            now = self.timer.now()
            self.progress.elapsed_seconds += now - self.elapsed_mark
            self.elapsed_mark = now

    def _elapsed_tokens_per_second(self) -> float:
        if self.first_update_at is None:
            return 0.0
        return self.session_tokens / max(self.timer.now() - self.first_update_at, 1e-9)

    def _seconds_per_update(self) -> float:
        return self.session_seconds / max(self.session_updates, 1)
