"""What result.json and the train rows report: elapsed time over resumes, training vs evaluation peak
memory, timing windows that end on an idle device, and the best epoch in epoch state files."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from async_device import use_async_device
from train_helpers import small_recipe

from tiny_llm.engines import run_training
from tiny_llm.io import read_json
from tiny_llm.runtime import signals
from tiny_llm.train import checkpoint, loop
from tiny_llm.train.engine import ModelEngine

pytestmark = pytest.mark.slow
SHORT = ("training.tokens_per_parameter=0.1", "training.epoch_tokens_per_parameter=0.04")  # 15 updates


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _wrap_evaluate(monkeypatch: pytest.MonkeyPatch, after: Callable[[str, object], object]) -> None:
    evaluate = loop.evaluate

    def wrapped(*args: object, **kwargs: object) -> object:
        return after(kwargs["split"], evaluate(*args, **kwargs))

    monkeypatch.setattr(loop, "evaluate", wrapped)


def test_elapsed_figures_exclude_the_final_validation_and_add_up_over_resumes(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every update 'takes' 10 s more, every subset validation 100 s, the full validation 10,000 s."""
    device = use_async_device(monkeypatch, lambda d, n: d.queue(10.0))  # device work: waited for at a pause

    def slow_evaluation(split: str, result: object) -> object:
        device.host_work(10_000.0 if split == "full" else 100.0)
        return result

    _wrap_evaluate(monkeypatch, slow_evaluation)
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run")  # 28 updates, 3 epochs
    account = loop.Trainer._account

    def account_then_stop(self: loop.Trainer, *args: object) -> None:
        account(self, *args)
        if self.progress.step == 15:  # after the first epoch's validation
            signals.request_stop()

    started = time.perf_counter()
    with monkeypatch.context() as mp:
        mp.setattr(loop.Trainer, "_account", account_then_stop)
        assert run_training(recipe, resume="auto", quiet=True) == 130
    assert run_training(recipe, resume="auto", quiet=True) == 0
    real = time.perf_counter() - started
    result = read_json(tmp_path / "run" / "result.json")
    assert 28 * 10 <= result["training_seconds"] < 28 * 10 + real
    simulated = 28 * 10 + 3 * 100  # both sessions' updates and subset validations, no full validation
    assert simulated <= result["training_elapsed_seconds"] < simulated + real
    assert result["elapsed_tokens_per_second"] == pytest.approx(
        result["tokens"] / result["training_elapsed_seconds"]
    )
    assert result["seconds_this_session"] >= 10_000  # this one includes the full validation
    final = checkpoint.load_state(tmp_path / "run" / checkpoint.FINAL)
    assert final["progress"]["elapsed_seconds"] == result["training_elapsed_seconds"]
    assert_reference_throughput_script_agrees(tmp_path / "run", result)


def test_a_validation_left_pending_by_an_interruption_is_in_the_elapsed_time(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped inside the first epoch's validation, the run resumes with it pending: that validation, run on
    resume before any update, is training's elapsed time as every subset validation is."""
    device = use_async_device(monkeypatch, lambda d, n: d.queue(10.0))
    _wrap_evaluate(monkeypatch, lambda split, result: device.host_work(100.0 * (split != "full")) or result)
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run")  # 28 updates, 3 epochs
    evaluate = loop.evaluate

    def stopping_evaluate(*args: object, **kwargs: object) -> object:
        signals.request_stop()  # the evaluation stops at its first batch: the epoch's validation is pending
        return evaluate(*args, **kwargs)

    started = time.perf_counter()
    with monkeypatch.context() as mp:
        mp.setattr(loop, "evaluate", stopping_evaluate)
        assert run_training(recipe, resume="auto", quiet=True) == 130
    assert checkpoint.load_state(tmp_path / "run" / checkpoint.LATEST)["progress"]["pending_epoch"] == 1
    assert run_training(recipe, resume="auto", quiet=True) == 0
    real = time.perf_counter() - started
    simulated = 28 * 10 + 3 * 100  # every update and every subset validation, the pending one included
    result = read_json(tmp_path / "run" / "result.json")
    assert simulated <= result["training_elapsed_seconds"] < simulated + real


def assert_reference_throughput_script_agrees(run_dir: Path, result: dict) -> None:
    """The reference's throughput script sums the train rows' window seconds and tokens: over a resumed run
    that gives the run's true tokens/s; the cumulative seconds have a name of their own."""
    train = [r for r in rows(run_dir) if r["event"] == "train"]
    seconds = sum(r["training_seconds"] for r in train)
    tokens = sum(r["tokens_per_second"] * r["training_seconds"] for r in train)  # each window's tokens
    assert seconds == pytest.approx(result["training_seconds"], rel=1e-9)
    assert tokens == pytest.approx(result["tokens"], rel=1e-9)
    assert tokens / seconds == pytest.approx(result["training_tokens_per_second"], rel=1e-9)
    assert train[-1]["cumulative_training_seconds"] == result["training_seconds"]
    assert all(r["training_seconds"] >= 10 for r in train)  # a window, not the run so far


@pytest.fixture
def recorded_run(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, list[object]]:
    """A run on the asynchronous stand-in: training raises the peak memory to 100 + step, evaluations to
    1,000 / 5,000; the device's synchronisations are recorded between updates."""
    device = use_async_device(monkeypatch, lambda d, n: (d.queue(0.1), d.raise_peak(100 + n)))

    def evaluation(split: str, result: object) -> object:
        device.raise_peak(5000 if split == "full" else 1000)
        return result

    _wrap_evaluate(monkeypatch, evaluation)
    run_dir = tmp_path / "run"
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, *SHORT), quiet=True) == 0
    return run_dir, device.events


def test_training_and_evaluation_peaks_are_reported_apart(recorded_run: tuple[Path, list[object]]) -> None:
    run_dir, _ = recorded_run
    metrics = rows(run_dir)
    train = [r for r in metrics if r["event"] == "train"]
    assert train and all(r["peak_memory_bytes"] == 100 + r["step"] for r in train)
    validation = [r for r in metrics if r["event"] != "train"]
    assert [r["evaluation_peak_memory_bytes"] for r in validation] == [1000, 1000, 1000, 5000]
    result = read_json(run_dir / "result.json")
    assert result["peak_memory_bytes"] == 100 + result["step"]
    assert result["evaluation_peak_memory_bytes"] == 5000


def test_timing_windows_start_and_end_on_an_idle_device(recorded_run: tuple[Path, list[object]]) -> None:
    run_dir, events = recorded_run
    row_steps = [r["step"] for r in rows(run_dir) if r["event"] == "train"]
    assert row_steps[-1] == 15
    for step in row_steps:  # the window's last update is synchronised before its clock is read
        assert events[events.index(("update", step)) + 1] == "sync"
    for step in [1, *(s + 1 for s in row_steps[:-1])]:  # and its first starts on an idle device
        assert "sync" in events[events.index(("update", step)) - 2 : events.index(("update", step))]


def test_epoch_state_files_know_their_epoch_and_best_never_gets_worse(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted: Iterator[float] = iter([5.0, 3.0, 4.0])  # epochs 1, 2, 3: the best is epoch 2

    def subset_loss(split: str, result: object) -> object:
        return dataclasses.replace(result, loss=next(scripted)) if split == "subset" else result

    _wrap_evaluate(monkeypatch, subset_loss)
    run_dir = tmp_path / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *SHORT, "training.checkpoint_policy=all")
    assert run_training(recipe, quiet=True) == 0
    for epoch, best in ((1, 1), (2, 2), (3, 2)):
        progress = checkpoint.load_state(run_dir / f"epoch-{epoch:03d}.pt")["progress"]
        assert (progress["epochs_done"], progress["best_epoch"]) == (epoch, best)
    assert read_json(run_dir / "best.json") == {"epoch": 2, "loss": 3.0, "weights": "epoch-002.safetensors"}

    scripted = iter([4.0])  # resumed from epoch 2's state, epoch 3 again scores 4.0
    assert run_training(recipe, resume=str(run_dir / "epoch-002.pt"), quiet=True) == 0
    assert read_json(run_dir / "best.json") == {"epoch": 2, "loss": 3.0, "weights": "epoch-002.safetensors"}
    result = read_json(run_dir / "result.json")
    assert (result["best_epoch"], result["best_subset_loss"]) == (2, 3.0)


def test_grad_norm_is_the_windows_last_update_and_its_mean_has_a_name_of_its_own(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    norms: dict[int, float] = {}
    step = ModelEngine.train_step

    def recording(self: ModelEngine, blocks: torch.Tensor, lr: float, n: int):  # noqa: ANN202
        stats = step(self, blocks, lr, n)
        norms[n] = stats.grad_norm
        return stats

    monkeypatch.setattr(ModelEngine, "train_step", recording)
    run_dir = tmp_path / "run"
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, *SHORT), quiet=True) == 0
    train = [r for r in rows(run_dir) if r["event"] == "train"]
    previous = 0
    for row in train:
        window = [norms[n] for n in range(previous + 1, row["step"] + 1)]
        assert row["grad_norm"] == norms[row["step"]]
        assert row["grad_norm_window_mean"] == pytest.approx(sum(window) / len(window), rel=1e-12)
        previous = row["step"]
    assert any(r["grad_norm"] != r["grad_norm_window_mean"] for r in train)


def test_checkpoint_epochs_keep_only_the_listed_epochs_states(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    sets = ("training.checkpoint_policy=interval", "training.checkpoint_epochs=[2]")
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, *SHORT, *sets), quiet=True) == 0
    assert sorted(p.name for p in run_dir.glob("epoch-*")) == ["epoch-002.pt", "epoch-002.safetensors"]
    assert checkpoint.load_state(run_dir / "epoch-002.pt")["progress"]["epochs_done"] == 2
    best = read_json(run_dir / "best.json")
    assert best["weights"] == ("epoch-002.safetensors" if best["epoch"] == 2 else None)
