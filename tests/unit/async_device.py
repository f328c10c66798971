"""A CPU model of an asynchronous device, for the run's clock: an update queues "device work" and returns
at once; only a synchronize waits for it. Time is virtual (an offset on the host's clock), so a test of
seconds of device work runs in milliseconds and no margin depends on how busy the machine is."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch

from tiny_llm.runtime.engine import StepStats
from tiny_llm.train import loop
from tiny_llm.train.engine import ModelEngine


class AsyncDevice:
    """Stands in for ``DeviceTimer``; ``events`` records ("update", n), "sync" and "reset" in order."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.busy_until = 0.0
        self.queued = 0.0
        self.peak_bytes = 0
        self.events: list[object] = []

    def now(self) -> float:
        return time.perf_counter() + self.offset

    def queue(self, seconds: float) -> None:
        """Work that starts when the device is free and takes ``seconds``; the host does not wait."""
        self.busy_until = max(self.now(), self.busy_until) + seconds
        self.queued += seconds

    def host_work(self, seconds: float) -> None:
        """Time the host itself spends (advances the clock at once)."""
        self.offset += seconds

    def synchronize(self) -> None:
        self.events.append("sync")
        self.offset += max(0.0, self.busy_until - self.now())

    def reset_peak(self) -> None:
        self.events.append("reset")
        self.peak_bytes = 0

    def peak(self) -> int:
        return self.peak_bytes

    def raise_peak(self, value: int) -> None:
        self.peak_bytes = max(self.peak_bytes, value)

    def between_updates(self) -> list[tuple[int, list[object]]]:
        """(n, the events after update n and before update n + 1) for every update but the last."""
        updates = [i for i, e in enumerate(self.events) if isinstance(e, tuple)]
        return [
            (self.events[i][1], self.events[i + 1 : j])  # type: ignore[index]
            for i, j in zip(updates, updates[1:], strict=False)
        ]


def use_async_device(
    monkeypatch: pytest.MonkeyPatch, work: Callable[[AsyncDevice, int], None] | None = None
) -> AsyncDevice:
    """Runs of this test see ``AsyncDevice`` as their device's timer; each update of the ordinary engine
    records itself and then calls ``work(device, step)`` (default: queue 0.5 s of device work)."""
    device = AsyncDevice()
    monkeypatch.setattr(loop, "device_timer", lambda _: device)
    step = ModelEngine.train_step
    work = work or (lambda d, n: d.queue(0.5))

    def queued(self: ModelEngine, blocks: torch.Tensor, lr: float, n: int) -> StepStats:
        device.events.append(("update", n))
        work(device, n)
        return step(self, blocks, lr, n)

    monkeypatch.setattr(ModelEngine, "train_step", queued)
    return device
