"""Bitwise resume on CPU (deterministic): interrupted-and-resumed runs equal the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from train_helpers import cli_sets, metric_rows, small_recipe

from tiny_llm.engines import run_training
from tiny_llm.errors import RunStateError
from tiny_llm.io import exclusive_lock, read_json
from tiny_llm.runtime import signals
from tiny_llm.train import loop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path, tiny_recipe_args: Callable) -> Path:
    run_dir = tmp_path_factory.mktemp("baseline") / "run"
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir), quiet=True) == 0
    return run_dir


def assert_same_run(run_dir: Path, baseline: Path) -> None:
    assert metric_rows(run_dir) == metric_rows(baseline)
    assert (run_dir / "final.safetensors").read_bytes() == (baseline / "final.safetensors").read_bytes()
    assert read_json(run_dir / "best.json") == read_json(baseline / "best.json")
    ours, theirs = read_json(run_dir / "result.json"), read_json(baseline / "result.json")
    for key in ("tokens", "step", "epochs", "best_subset_loss", "best_epoch", "recipe_identity"):
        assert ours[key] == theirs[key], key
    assert ours["final_validation"]["loss"] == theirs["final_validation"]["loss"]


def test_baseline_run_files(baseline: Path) -> None:
    rows = metric_rows(baseline)
    train = [r for r in rows if r["event"] == "train"]
    assert [r["step"] for r in rows if r["event"] == "validation"] == [11, 22, 28]
    assert {11, 22, 28} <= {r["step"] for r in train}  # epoch ends always get a row
    assert [r["epoch"] for r in rows if r["event"] == "validation"] == [1, 2, 3]
    assert rows[-1]["event"] == "final_validation" and rows[-1]["split"] == "full"
    full = json.loads((baseline / "metrics.jsonl").read_text().splitlines()[0])
    assert set(full) >= {
        "event", "step", "epoch", "tokens", "loss", "lr", "grad_norm", "tokens_per_second",
        "training_seconds", "elapsed_tokens_per_second", "peak_memory_bytes",
    }  # fmt: skip
    result = read_json(baseline / "result.json")
    assert result["tokens"] == 413 * 64 and result["step"] == 28 and result["epochs"] == 3
    assert read_json(baseline / "status.json")["status"] == "complete"
    assert not (baseline / "latest.pt").exists() and (baseline / "final.pt").exists()


def _stop_after_update(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    account = loop.Trainer._account

    def account_then_stop(self: loop.Trainer, *args: object) -> None:
        account(self, *args)
        if self.progress.step == step:
            signals.request_stop()

    monkeypatch.setattr(loop.Trainer, "_account", account_then_stop)


def _stop_during_validation(monkeypatch: pytest.MonkeyPatch, split: str) -> None:
    evaluate = loop.evaluate

    def stopping_evaluate(*args: object, **kwargs: object) -> object:
        if kwargs["split"] == split:
            signals.request_stop()
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", stopping_evaluate)


def _stop_inside_update(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Stop after the first microbatch of update ``step``: the partial update is discarded."""
    update = loop.Trainer.update

    def stopping_update(self: loop.Trainer) -> None:
        if self.progress.step == step - 1:
            signals.request_stop()
        update(self)

    monkeypatch.setattr(loop.Trainer, "update", stopping_update)


def test_interrupted_four_times_equals_uninterrupted(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run")
    stops = [
        (lambda mp: _stop_after_update(mp, 3), 3),  # mid-epoch
        (lambda mp: _stop_during_validation(mp, "subset"), 11),  # end of epoch 1, validation pending
        (lambda mp: _stop_inside_update(mp, 17), 16),  # between microbatches of update 17
        (lambda mp: _stop_during_validation(mp, "full"), 28),  # final full validation
    ]
    for arrange, expected_step in stops:
        with pytest.MonkeyPatch.context() as mp:
            arrange(mp)
            assert run_training(recipe, resume="auto", quiet=True) == 130
        status = read_json(tmp_path / "run" / "status.json")
        assert status == {"status": "interrupted", "step": expected_step, "tokens": status["tokens"]}
        assert (tmp_path / "run" / "latest.pt").exists()
    first_environment = (tmp_path / "run" / "environment.json").read_text()
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert_same_run(tmp_path / "run", baseline)
    assert not (tmp_path / "run" / "latest.pt").exists()  # policy final keeps only final.pt
    assert (tmp_path / "run" / "environment.json").read_text() == first_environment  # the first session's
    assert (
        read_json(tmp_path / "run" / "environment-resume.json")["recipe_identity"]
        == read_json(baseline / "result.json")["recipe_identity"]
    )


def _wait_for_row(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        if path.exists():
            lines = path.read_text().splitlines()
            if lines and any(json.loads(line).get("step", 0) >= step for line in lines[-2:]):
                return
        time.sleep(0.02)
    raise AssertionError(f"no metrics row at step {step} within {timeout} s")


def _start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "tiny_llm", "train", *args, "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_sigterm_saves_and_exits_130_then_resumes_bitwise(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    proc = _start(cli_sets(tiny_cache, tiny_recipe_args, run_dir))
    _wait_for_row(run_dir, 4, proc)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130, proc.stderr.read().decode()
    assert time.monotonic() - sent < 10
    status = read_json(run_dir / "status.json")
    assert status["status"] == "interrupted" and 4 <= status["step"] < 28
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir), resume="auto", quiet=True) == 0
    assert_same_run(run_dir, baseline)


def test_sigkill_under_interval_policy_resumes_bitwise(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    extra = ("training.checkpoint_policy=interval", "training.checkpoint_every=3")
    proc = _start(cli_sets(tiny_cache, tiny_recipe_args, run_dir, *extra))
    _wait_for_row(run_dir, 8, proc)
    proc.kill()
    proc.wait(timeout=60)
    assert (run_dir / "latest.pt").exists()
    assert read_json(run_dir / "status.json")["status"] == "running"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *extra)
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert_same_run(run_dir, baseline)
    assert (run_dir / "latest.pt").exists()  # interval keeps the rolling state next to final.pt


def test_changed_recipe_is_refused_naming_the_keys(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    recipe = small_recipe(
        tiny_cache, tiny_recipe_args, tmp_path / "other", "optimizer.lr=0.01", "model.num_layers=3"
    )
    with pytest.raises(
        RunStateError, match=r"recipe changed \(model.num_layers: 2 -> 3; optimizer.lr: 0.003"
    ):
        run_training(recipe, resume=str(baseline / "final.pt"), quiet=True)
    assert not (tmp_path / "other" / "resolved.yaml").exists()


def test_execution_only_changes_are_accepted(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    extra = ("runtime.cpu_threads=2", "runtime.device=auto", "data.prefetch=false")
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "moved", *extra)
    resumed: list[int] = []
    with pytest.MonkeyPatch.context() as mp:  # the identity check happens in start(); skip the work
        mp.setattr(loop.Trainer, "run", lambda self: resumed.append(self.progress.step) or 0)
        assert run_training(recipe, resume=str(baseline / "final.pt"), quiet=True) == 0
    assert resumed == [28]
    resolved = (tmp_path / "moved" / "resolved.yaml").read_text()
    assert "cpu_threads: 2" in resolved and "device: auto" in resolved


def test_second_trainer_on_the_same_directory_is_refused(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    with (
        exclusive_lock(run_dir / ".lock", "held by the test"),
        pytest.raises(RunStateError, match=r"run directory .* is in use by another process"),
    ):
        run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir), quiet=True)


def test_existing_state_needs_resume_and_complete_runs_are_kept(
    baseline: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    recipe = small_recipe(tiny_cache, tiny_recipe_args, baseline)
    with pytest.raises(RunStateError, match="already holds training state .*--resume auto"):
        run_training(recipe, quiet=True)
    before = (baseline / "result.json").read_bytes()
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert (baseline / "result.json").read_bytes() == before


@pytest.fixture(scope="module")
def finished_without_state(
    tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path, tiny_recipe_args: Callable
) -> Path:
    run_dir = tmp_path_factory.mktemp("none") / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "training.checkpoint_policy=none")
    assert run_training(recipe, quiet=True) == 0
    assert not list(run_dir.glob("*.pt"))
    return run_dir


def test_a_finished_run_without_state_is_not_overwritten(
    finished_without_state: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = finished_without_state
    before = (run_dir / "result.json").read_bytes()
    same = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "training.checkpoint_policy=none")
    with pytest.raises(RunStateError, match="already holds a finished run"):
        run_training(same, quiet=True)
    other = small_recipe(
        tiny_cache, tiny_recipe_args, run_dir, "training.checkpoint_policy=none", "optimizer.lr=0.01"
    )
    for resume, refusal in (
        (None, "already holds a finished run"),
        ("auto", "holds a run of another recipe"),
    ):
        with pytest.raises(RunStateError, match=refusal):
            run_training(other, resume=resume, quiet=True)
    assert (run_dir / "result.json").read_bytes() == before
    assert run_training(same, resume="auto", quiet=True) == 0  # the same identity: confirmed, kept
    assert (run_dir / "result.json").read_bytes() == before


def test_a_changed_recipe_sets_the_old_run_aside_when_asked(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(baseline, run_dir)
    recipe_file = run_dir / "recipe.yaml"
    recipe_file.write_text("the new recipe, kept in place\n")
    old = read_json(run_dir / "result.json")
    other = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "optimizer.lr=0.01")
    started: list[int] = []
    with pytest.MonkeyPatch.context() as mp:  # whether it resumes is decided in start(); skip the work
        mp.setattr(loop.Trainer, "run", lambda self: started.append(self.progress.step) or 0)
        assert (
            run_training(other, resume="auto", quiet=True, set_aside_changed=True, keep=(recipe_file,)) == 0
        )
    assert started == [0]  # afresh: never a resume of the other identity
    aside = tmp_path / "run.replaced-1"
    assert read_json(aside / "result.json") == old and (aside / "final.pt").is_file()
    assert recipe_file.read_text() == "the new recipe, kept in place\n"
    assert not (run_dir / "final.pt").exists() and not (run_dir / "result.json").exists()
