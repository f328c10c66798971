"""A CPU model of an asynchronous device, for the run's clock: an update queues "device work" and returns
at once; only a synchronize waits for it. Time is virtual (an offset on the host's clock), so a test of
seconds of device work runs in milliseconds and no margin depends on how busy the machine is.

Every way the library could wait for the device goes to it: the clock's timer, ``runtime.device.synchronize``
under every name a ``tiny_llm`` module imported it as, and ``torch.cuda``'s own (``synchronize``, a stream's),
so a synchronize added anywhere shows in its events; and ``watch_reads`` puts host reads of tensor values
(``host_reads.HostReads``) on the same timeline."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from host_reads import HostReads

from tiny_llm.runtime import device as device_module
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

    def watch_reads(self) -> HostReads:
        """A host-read counter whose reads are events here too: ``("read", what)``."""
        return HostReads(on_read=lambda what: self.events.append(("read", what)))

    def between_updates(self) -> list[tuple[int, list[object]]]:
        """(n, the events after update n and before update n + 1) for every update but the last."""
        updates = [i for i, e in enumerate(self.events) if isinstance(e, tuple) and e[0] == "update"]
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
    wait_for_device(monkeypatch, device)
    step = ModelEngine.train_step
    work = work or (lambda d, n: d.queue(0.5))

    def queued(self: ModelEngine, blocks: torch.Tensor, lr: float, n: int) -> StepStats:
        device.events.append(("update", n))
        work(device, n)
        return step(self, blocks, lr, n)

    monkeypatch.setattr(ModelEngine, "train_step", queued)
    return device


class _Stream:
    def __init__(self, device: AsyncDevice) -> None:
        self.device = device

    def synchronize(self) -> None:
        self.device.synchronize()


def wait_for_device(monkeypatch: pytest.MonkeyPatch, device: AsyncDevice) -> None:
    """Every synchronize the library could call waits for ``device`` (and is an event)."""

    def synchronize(*args: Any, **kwargs: Any) -> None:
        device.synchronize()

    original = device_module.synchronize
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("tiny_llm") and getattr(module, "synchronize", None) is original:
            monkeypatch.setattr(module, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _Stream(device))
    monkeypatch.setattr(torch.cuda, "default_stream", lambda *a, **k: _Stream(device))
