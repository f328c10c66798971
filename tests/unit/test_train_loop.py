"""Training runs: checkpoint policies, run-directory files, failures, evaluation, device slots."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from train_helpers import small_recipe

from tiny_llm.budget import make_budget
from tiny_llm.cli import main
from tiny_llm.engines import evaluate_checkpoint, run_training
from tiny_llm.io import read_json
from tiny_llm.runtime import device as device_module
from tiny_llm.runtime.engine import NonFiniteError
from tiny_llm.train.engine import ModelEngine

pytestmark = pytest.mark.slow
SHORT = ("training.tokens_per_parameter=0.1", "training.epoch_tokens_per_parameter=0.04")  # 15 updates


@pytest.fixture(scope="module")
def all_policy_run(
    tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path, tiny_recipe_args: Callable
) -> Path:
    run_dir = tmp_path_factory.mktemp("all") / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *SHORT, "training.checkpoint_policy=all")
    assert run_training(recipe, quiet=True) == 0
    return run_dir


def test_policy_all_writes_epoch_files_and_best(all_policy_run: Path) -> None:
    names = {p.name for p in all_policy_run.iterdir()}
    for epoch in (1, 2, 3):
        assert f"epoch-{epoch:03d}.safetensors" in names and f"epoch-{epoch:03d}.pt" in names
    assert {"latest.pt", "final.pt", "final.safetensors", "resolved.yaml", "environment.json"} <= names
    rows = [json.loads(x) for x in (all_policy_run / "metrics.jsonl").read_text().splitlines()]
    subset = {r["epoch"]: r["loss"] for r in rows if r["event"] == "validation"}
    best = read_json(all_policy_run / "best.json")
    assert best["loss"] == min(subset.values()) and subset[best["epoch"]] == best["loss"]
    assert best["weights"] == f"epoch-{best['epoch']:03d}.safetensors"


def test_environment_and_result_files(all_policy_run: Path) -> None:
    env = read_json(all_policy_run / "environment.json")
    assert env["parameters"] == 131_904 and env["compiled"] is False
    assert env["packages"]["torch"] == torch.__version__ and env["threads"] == 1
    assert env["recipe_identity"] == read_json(all_policy_run / "result.json")["recipe_identity"]
    assert any("softmax" in k for k in env["attention_kernels"])  # deterministic -> reference attention
    result = read_json(all_policy_run / "result.json")
    assert set(result) >= {
        "parameters", "tokens", "step", "epochs", "best_subset_loss", "best_epoch", "final_validation",
        "seconds_this_session", "training_seconds", "training_elapsed_seconds", "training_tokens_per_second",
        "elapsed_tokens_per_second", "peak_memory_bytes", "recipe_identity", "evaluation_tokens_per_second",
    }  # fmt: skip
    assert result["final_validation"]["split"] == "full" and result["final_validation"]["validation_complete"]
    assert "epoch 3/3 step 15/15" in (all_policy_run / "run.log").read_text()


def test_evaluate_matches_the_final_validation(all_policy_run: Path) -> None:
    from tiny_llm.config import load_recipe

    recipe = load_recipe([str(all_policy_run / "resolved.yaml")])
    expected = read_json(all_policy_run / "result.json")["final_validation"]
    by_weights = evaluate_checkpoint(recipe, all_policy_run / "final.safetensors", full=True)
    assert by_weights["loss"] == expected["loss"] and by_weights["tokens"] == expected["tokens"]
    assert by_weights["bpb"] == expected["bpb"] and by_weights["bytes"] == expected["bytes"] > 0
    assert 0 < expected["bpb"] < expected["loss"] / math.log(2)  # a BPE token holds more than one byte
    epoch3 = evaluate_checkpoint(recipe, all_policy_run / "epoch-003.pt", full=False)
    rows = [json.loads(x) for x in (all_policy_run / "metrics.jsonl").read_text().splitlines()]
    assert epoch3["loss"] == [r["loss"] for r in rows if r["event"] == "validation"][-1]
    assert epoch3["bpb"] == [r["bpb"] for r in rows if r["event"] == "validation"][-1]


def test_evaluate_command_writes_json(
    all_policy_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "eval.json"
    args = [
        "--config",
        str(all_policy_run / "resolved.yaml"),
        "--checkpoint",
        str(all_policy_run / "final.pt"),
    ]
    assert main(["evaluate", *args, "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == read_json(out)
    assert set(printed) >= {"loss", "perplexity", "tokens", "seconds", "split", "validation_complete", "bpb"}
    assert printed["split"] == "subset"
    assert main(["evaluate", "--config", str(all_policy_run / "resolved.yaml"), "--checkpoint", "x.bin"]) == 2
    assert "error: checkpoint not found: x.bin" in capsys.readouterr().err


def test_policy_none_writes_no_state(tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable) -> None:
    extra = ("training.tokens_per_parameter=0.05", "training.epoch_tokens_per_parameter=0.05")
    recipe = small_recipe(
        tiny_cache, tiny_recipe_args, tmp_path / "run", *extra, "training.checkpoint_policy=none"
    )
    assert run_training(recipe, quiet=True) == 0
    assert not [p for p in (tmp_path / "run").iterdir() if p.suffix in (".pt", ".safetensors")]
    assert read_json(tmp_path / "run" / "result.json")["epochs"] == 1


def test_non_finite_update_fails_the_run(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = ModelEngine.train_step

    def failing(self: ModelEngine, blocks: torch.Tensor, lr: float, n: int):  # noqa: ANN202
        if n == 3:
            raise NonFiniteError(n, "non-finite loss (loss nan, grad_norm nan)")
        return step(self, blocks, lr, n)

    monkeypatch.setattr(ModelEngine, "train_step", failing)
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run", *SHORT)
    assert run_training(recipe, quiet=True) == 1
    status = read_json(tmp_path / "run" / "status.json")
    assert status["status"] == "failed" and status["step"] == 2
    assert status["error"] == "step 3: non-finite loss (loss nan, grad_norm nan)"
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.parametrize("policy", ["final", "interval"])
def test_a_non_finite_fused_update_fails_the_run_at_its_own_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, policy: str
) -> None:
    """Fused AdamW skips the bad update (5) on the device; the loop finds it at the next train row (step 6,
    log_every 2) or, saving after every update, before it saves step 5, and fails the run at step 5."""
    from tiny_llm.train import engine as engine_module

    finite, train_step, current = engine_module.loss_sum, ModelEngine.train_step, [0]

    def numbered(self: ModelEngine, blocks: torch.Tensor, lr: float, n: int):  # noqa: ANN202
        current[0] = n  # the update whose microbatches follow (not the attention-kernel probe's pass)
        return train_step(self, blocks, lr, n)

    def nan_in_update_5(*args: object) -> torch.Tensor:
        return finite(*args) * (float("nan") if current[0] == 5 else 1.0)

    monkeypatch.setattr(ModelEngine, "train_step", numbered)
    monkeypatch.setattr(engine_module, "loss_sum", nan_in_update_5)
    sets = ("runtime.deterministic=false", "runtime.fused_optimizer=true", "training.checkpoint_every=1")
    run_dir = tmp_path / "run"
    recipe = small_recipe(
        tiny_cache, tiny_recipe_args, run_dir, *SHORT, *sets, f"training.checkpoint_policy={policy}"
    )
    assert run_training(recipe, quiet=True) == 1
    status = read_json(run_dir / "status.json")
    assert status["error"] == "step 5: non-finite loss (loss nan, grad_norm nan)"
    assert status["status"] == "failed" and status["step"] == 4
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["event"] == "train"] == [2, 4]
    if policy == "interval":
        assert torch.load(run_dir / "latest.pt", weights_only=False)["progress"]["step"] == 4
        assert current[0] == 5  # found before step 5 was saved
    else:
        assert not (run_dir / "latest.pt").exists() and current[0] == 6  # found at step 6's row


def test_a_stop_after_a_skipped_update_fails_the_run_instead_of_saving_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    from tiny_llm.runtime import signals
    from tiny_llm.train import engine as engine_module

    finite, train_step, current = engine_module.loss_sum, ModelEngine.train_step, [0, 0]

    def numbered(self: ModelEngine, blocks: torch.Tensor, lr: float, n: int):  # noqa: ANN202
        current[:] = [n, 0]  # the update whose microbatches follow (not the attention-kernel probe's pass)
        return train_step(self, blocks, lr, n)

    def nan_in_update_3_then_stop(*args: object) -> torch.Tensor:
        current[1] += 1
        if current == [3, 2]:  # update 3's last microbatch
            signals.request_stop()
            return finite(*args) * float("nan")
        return finite(*args)

    monkeypatch.setattr(ModelEngine, "train_step", numbered)
    monkeypatch.setattr(engine_module, "loss_sum", nan_in_update_3_then_stop)
    sets = (
        "runtime.deterministic=false",
        "runtime.fused_optimizer=true",
        "training.checkpoint_policy=interval",
    )
    run_dir = tmp_path / "run"
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, *SHORT, *sets), quiet=True) == 1
    status = read_json(run_dir / "status.json")
    assert status["status"] == "failed" and status["step"] == 2
    assert status["error"] == "step 3: non-finite loss (loss nan, grad_norm nan)"
    assert not (run_dir / "latest.pt").exists()


def test_cache_too_small_is_a_user_error(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, capsys: pytest.CaptureFixture
) -> None:
    sets = [
        *tiny_recipe_args(tiny_cache),
        f"runtime.output_dir={tmp_path / 'run'}",
        "training.tokens_per_parameter=5",
    ]
    code = main(["train", "--config", "tiny", *[a for s in sets for a in ("--set", s)]])
    assert code == 2
    assert "cache too small: need 659521 tokens" in capsys.readouterr().err


def test_data_passes_repeat_the_cache_prefix_and_say_so(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    """207 blocks in 2 passes over 104 unique ones; 5 tokens per parameter in 20 passes fit a small cache."""
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run", *SHORT, "training.data_passes=2")
    assert run_training(recipe, quiet=True) == 0
    log = (tmp_path / "run" / "run.log").read_text()
    assert "data: 2 passes over 6656 unique tokens (training.data_passes)" in log
    result = read_json(tmp_path / "run" / "result.json")
    assert result["tokens"] == 207 * 64 and result["final_validation"]["loss"] > 0
    long = ("training.tokens_per_parameter=5", "training.data_passes=20")  # 659,521 tokens in one pass
    assert (
        make_budget(small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "x", *long)).cache_tokens_needed
        == 33_025
    )


def test_free_gpu_slots_are_claimed_once(tmp_path: Path) -> None:
    paths = [tmp_path / "gpu-0.lock", tmp_path / "gpu-1.lock"]
    held = len(device_module._GPU_LOCKS)
    try:
        assert device_module.claim_first_free(paths) == 0
        assert (
            device_module.claim_first_free(paths) == 1
        )  # flock is per open file: a second claimant moves on
        assert device_module.claim_first_free(paths) is None
    finally:
        for fd in device_module._GPU_LOCKS[held:]:
            os.close(fd)
        del device_module._GPU_LOCKS[held:]
    assert device_module.claim_first_free(paths) == 0
    os.close(device_module._GPU_LOCKS.pop())


def test_cpu_threads_default_follows_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert device_module.default_cpu_threads() == 3
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert device_module.default_cpu_threads() == len(os.sched_getaffinity(0))


def test_auto_device_without_gpu_is_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert device_module.select_device("auto") == torch.device("cpu")
    from tiny_llm.errors import ConfigError

    no_cuda = "runtime.device: 'cuda' asks for CUDA, but torch .* here is a CPU-only build; install a CUDA"
    with pytest.raises(ConfigError, match=no_cuda):
        device_module.select_device("cuda")


def test_a_job_given_a_gpu_that_finds_no_cuda_fails_in_one_line_naming_the_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`auto` trains on the CPU only where no GPU was asked for: a workflow GPU job (TINY_LLM_REQUIRE_CUDA)
    on a CPU-only torch (an aarch64 wheel, say) stops at once, naming the build and where the fix is."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    monkeypatch.setenv(device_module.REQUIRE_CUDA_ENV, "1")
    run, cache = tmp_path / "run", tmp_path / "none"
    sets = ["runtime.device=auto", f"runtime.output_dir={run}", f"data.cache_dir={cache}"]
    code = main(["train", "--config", "tiny", *(a for pair in sets for a in ("--set", pair))])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    given = f"this job was given a GPU (TINY_LLM_REQUIRE_CUDA=1), but torch {torch.__version__} here is a "
    assert given in err[0]
    assert "CPU-only build; install a CUDA build of torch for " in err[0] and "docs/cluster.md" in err[0]
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build that sees no GPU says so instead
    with pytest.raises(device_module.ConfigError, match=r"\(CUDA 12.8\) sees no GPU"):
        device_module.select_device("auto")
