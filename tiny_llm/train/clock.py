"""The run's clock: timing windows, device synchronisation, peak memory and the elapsed figures.

The loop calls it at four points only: before and after an update (``begin_update``, ``end_update``), at a
train row (``close_row``), and around untimed work: a save, an evaluation, the end (``pause``). It is the only
code of a run that synchronises the device for timing or resets its peak memory.

A device queues an update's kernels and returns at once, so the time of one update means nothing on its
own; only a span that starts on an idle device and ends when its last update's kernels are done does. A
span opens (one synchronize) at the first update after a pause and closes (one synchronize) at the next row,
save or evaluation; between two updates of a span nothing waits for the device. The span's seconds go to the
open row window and to the run's training time. The peak memory is reset once per row window, where its
first update starts, and read at its row: a save inside it does not narrow it. An evaluation (which
follows a row) has a peak of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from tiny_llm.runtime.device import DeviceTimer
from tiny_llm.train.progress import Progress


class RunClock:
    """Stamps, counts and divides; ``progress`` is the run's (replace it with ``bind`` on a resume)."""

    def __init__(self, timer: DeviceTimer, progress: Progress) -> None:
        self.timer = timer
        self.progress = progress
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

    def bind(self, progress: Progress) -> None:
        self.progress = progress

    def now(self) -> float:
        return self.timer.now()

    # ------------------------------------------------------------------ updates

    def begin_update(self) -> None:
        """Open a span on an idle device if none is open, and the row window's peak with it."""
        if self.span_start is not None:
            return
        self.timer.synchronize()
        if not self.row_window_open:
            self.timer.reset_peak()
            self.row_window_open = True
        self.span_start = self.now()
        if self.first_update_at is None:
            self.first_update_at = self.span_start
        if self.elapsed_mark is None:
            self.elapsed_mark = self.span_start

    def end_update(self, tokens: int) -> None:
        """Count a queued update (no device wait)."""
        self.session_tokens += tokens
        self.session_updates += 1

    def pause(self) -> None:
        """Close the open span: wait for its updates' kernels, add its seconds to the window and the run."""
        if self.span_start is None:
            return
        self.timer.synchronize()
        seconds = self.now() - self.span_start
        self.span_start = None
        self.progress.training_seconds += seconds
        self.progress.window.seconds += seconds
        self.session_seconds += seconds
        self.tick_elapsed()

    def close_row(self) -> int:
        """End the row window (its span first); return its peak memory, folded into the run's."""
        self.pause()
        peak = self.fold_peak()
        self.row_window_open = False
        return peak

    def fold_peak(self) -> int:
        """The open row window's peak so far, folded into the run's training peak."""
        peak = max(self.timer.peak(), self.peak_floor())
        self.progress.peak_memory_bytes = max(self.progress.peak_memory_bytes or 0, peak)
        return peak

    # ------------------------------------------------------------------ evaluation and the elapsed time

    def start_evaluation(self) -> None:
        """Before an evaluation: the span closes, the row window's peak is kept, a peak of its own starts."""
        self.pause()
        if self.row_window_open:
            self.fold_peak()
            self.row_window_open = False
        self.timer.reset_peak()

    def end_evaluation(self) -> int:
        """The evaluation's peak, folded into the run's evaluation peak."""
        peak = self.timer.peak()
        p = self.progress
        p.evaluation_peak_memory_bytes = max(p.evaluation_peak_memory_bytes or 0, peak)
        return peak

    def start_elapsed(self) -> None:
        """Count wall time from now (validation left pending by an interruption belongs to training)."""
        self.elapsed_mark = self.now()

    def stop_elapsed(self) -> None:
        """Stop counting elapsed time (at the final state: the full validation is not in it)."""
        self.pause()
        self.tick_elapsed()
        self.elapsed_mark = None

    def tick_elapsed(self) -> None:
        """Add the wall time since the last tick to ``progress.elapsed_seconds`` while the clock runs."""
        if self.elapsed_mark is not None:
            now = self.now()
            self.progress.elapsed_seconds += now - self.elapsed_mark
            self.elapsed_mark = now

    def elapsed_tokens_per_second(self) -> float:
        """Tokens this session / wall time since this session's first update."""
        if self.first_update_at is None:
            return 0.0
        return self.session_tokens / max(self.now() - self.first_update_at, 1e-9)

    def seconds_per_update(self) -> float:
        """This session's mean update time over its closed spans (the ETA's rate)."""
        return self.session_seconds / max(self.session_updates, 1)
