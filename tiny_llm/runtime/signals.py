"""SIGINT/SIGTERM -> a stop flag the training loop (and the engine, between microbatches) polls."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

_stop: list[int] = []


def stop_requested() -> bool:
    return bool(_stop)


def request_stop(signum: int = signal.SIGTERM) -> None:
    if not _stop:
        _stop.append(signum)


def withdraw_stop() -> bool:
    """Take back a stop request (True if there was one): a caller that agrees stops with others first."""
    requested = bool(_stop)
    _stop.clear()
    return requested


def _handler(signum: int, frame: FrameType | None) -> None:
    request_stop(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into a stop request for the duration of the block."""
    _stop.clear()
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _stop.clear()
