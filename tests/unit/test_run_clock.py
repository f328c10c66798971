"""The run's clock against a CPU model of an asynchronous device (``async_device``): the train rows count
the device time their updates queued, the device is synchronised only where a span starts or ends (a
row, a save, an evaluation), never between two updates of a window, and the peak memory covers a window."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from async_device import AsyncDevice, use_async_device

from tiny_llm.config import load_recipe
from tiny_llm.engines import run_training
from tiny_llm.io import read_json

# 15 updates in 3 epochs; rows every 5 updates and at each epoch's end; the fused, sync-free update.
CLOCKED = (
    "training.tokens_per_parameter=0.1",
    "training.epoch_tokens_per_parameter=0.04",
    "training.log_every=5",
    "training.checkpoint_policy=interval",
    "training.checkpoint_every=7",
    "runtime.fused_optimizer=true",
    "runtime.cpu_threads=1",
)


def clocked_run(tmp_path: Path, cache: Path, recipe_args: Callable) -> tuple[list[dict], dict]:
    run_dir = tmp_path / "run"
    sets = [*recipe_args(cache), *CLOCKED, f"runtime.output_dir={run_dir}"]
    assert run_training(load_recipe(["tiny"], sets), quiet=True) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, read_json(run_dir / "result.json")


def pauses(rows: list[dict]) -> tuple[set[int], set[int]]:
    """(steps with a train row, steps after which the run paused: rows, saves and validations)."""
    row_steps = {r["step"] for r in rows if r["event"] == "train"}
    epoch_ends = {r["step"] for r in rows if r["event"] == "validation"}
    saves = {s for s in range(1, 16) if s % 7 == 0}
    return row_steps, row_steps | epoch_ends | saves


def test_train_rows_count_the_device_time_their_updates_queued(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = use_async_device(monkeypatch)  # each update queues 0.5 s of device work
    rows, result = clocked_run(tmp_path, tiny_cache, tiny_recipe_args)
    train = [r for r in rows if r["event"] == "train"]
    assert device.queued == pytest.approx(15 * 0.5)
    assert sum(r["training_seconds"] for r in train) >= device.queued
    assert result["training_seconds"] >= device.queued
    assert result["training_tokens_per_second"] <= result["tokens"] / device.queued
    previous = 0
    for row in train:  # a row's time is its window's, the device time of each of its updates included
        assert row["training_seconds"] >= 0.5 * (row["step"] - previous)
        previous = row["step"]


def test_the_device_is_synchronised_where_a_span_starts_or_ends_and_never_between_updates(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = use_async_device(monkeypatch)
    with device.watch_reads():  # host reads of tensor values on the same timeline
        rows, _ = clocked_run(tmp_path, tiny_cache, tiny_recipe_args)
    _, paused = pauses(rows)
    epoch_ends = {r["step"] for r in rows if r["event"] == "validation"}
    first = device.events.index(("update", 1))
    assert device.events[:first].count("sync") == 1  # the first span opens on an idle device
    for n, between in device.between_updates():
        # a pause closes the span (one wait) and the next update opens one (one wait); an evaluation waits
        # once at its end; nothing else waits, by any path (the clock, runtime.device, torch.cuda)
        assert between.count("sync") == (2 + (n in epoch_ends) if n in paused else 0), (n, between)
        reads = [e for e in between if isinstance(e, tuple) and e[0] == "read"]
        # the values of a window's updates are read at its row (or a save, an evaluation), never between
        assert (n in paused) or not reads, (n, reads)
        assert (n not in paused) or reads, (n, between)  # the counter was on: a pause reads
    assert device.events.count("sync") <= 1 + 3 * len(paused)


def test_the_peak_memory_is_reset_once_per_window_and_a_row_reports_its_window(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    def work(device: AsyncDevice, n: int) -> None:  # a window's first update has its highest peak
        device.queue(0.5)
        device.raise_peak(1000 - n)

    device = use_async_device(monkeypatch, work)
    rows, result = clocked_run(tmp_path, tiny_cache, tiny_recipe_args)
    row_steps, _ = pauses(rows)
    epoch_ends = {r["step"] for r in rows if r["event"] == "validation"}
    for n, between in device.between_updates():
        # a new window resets once; an epoch's validation has its own peak (one more reset)
        expected = (n in row_steps) + (n in epoch_ends)
        assert between.count("reset") == expected, (n, between)
    starts = [1, *sorted(s + 1 for s in row_steps if s < 15)]
    train = [r for r in rows if r["event"] == "train"]
    assert [r["peak_memory_bytes"] for r in train] == [1000 - s for s in starts]
    assert result["peak_memory_bytes"] == 999
