"""`train` with a packed recipe: metrics, exports, averaged evaluation, bitwise resume, identity checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import metric_rows

from tiny_llm.config import load_recipe
from tiny_llm.engines import evaluate_checkpoint, run_training
from tiny_llm.errors import RunStateError
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.packed.model import local_losses
from tiny_llm.runtime import signals
from tiny_llm.runtime.device import dispatched_attention_kernels

SETS = [
    "training.tokens_per_parameter=0.125",
    "training.epoch_tokens_per_parameter=0.0625",
    "training.checkpoint_policy=interval",
    "training.checkpoint_every=4",
    "training.log_every=1",
    "evaluation.subset_blocks=16",
    "runtime.cpu_threads=1",
]


def packed_recipe(cache: Path, args, run_dir: Path, *extra: str):
    return load_recipe(["packed4-tiny"], [*args(cache), *SETS, f"runtime.output_dir={run_dir}", *extra])


@pytest.fixture(scope="module")
def straight_run(tiny_cache, tiny_recipe_args, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("packed") / "straight"
    assert run_training(packed_recipe(tiny_cache, tiny_recipe_args, run_dir), quiet=True) == 0
    return run_dir


def test_packed_run_logs_workers_and_exports_average_and_nodes(straight_run):
    train = [r for r in metric_rows(straight_run) if r["event"] == "train"]
    assert train and all(len(r["local_losses"]) == 4 and len(r["local_grad_norms"]) == 4 for r in train)
    assert all(r["mixing_gamma"] == 1.0 and r["update_tokens_per_model"] * 4 <= 1024 for r in train)
    assert train[0]["update_tokens_per_model"] == 256  # worker i trains on blocks i, i+4, ... of 16
    assert all(r["tokens_per_model"] * 4 == r["tokens"] for r in train)  # cumulative, as the reference's
    assert all(r["grad_norm"] == max(r["local_grad_norms"]) for r in train)  # log_every 1: the update's max
    assert train[-1]["loss"] < train[0]["loss"]
    root = load_file(straight_run / "final.safetensors")
    nodes = [load_file(straight_run / f"node-{i:03d}" / "final.safetensors") for i in range(4)]
    for name, value in root.items():
        torch.testing.assert_close(value, torch.stack([n[name] for n in nodes]).mean(0))
    assert not torch.equal(
        nodes[0]["embed.weight"], nodes[1]["embed.weight"]
    )  # one-peer mixing keeps them apart


def test_packed_run_records_its_workers_mixing_and_attention_kernels(straight_run):
    result = json.loads((straight_run / "result.json").read_text())
    assert result["num_models"] == 4 and result["tokens_per_model"] * 4 == result["tokens"]
    assert result["total_parameters"] == 4 * result["parameters"]
    assert (result["topology"], result["scheme"]) == ("one_peer_exponential", "awc")
    train = [r for r in metric_rows(straight_run) if r["event"] == "train"]
    for row in train:  # exponential, N=4: peer offsets 1, 2, 1, 2, ... by 0-based update
        update = row["step"] - 1
        assert row["mixing_step"] == update and row["mixing_peer_offset"] == 1 << (update % 2)
        assert row["consensus_active"] is False
    recorded = json.loads((straight_run / "environment.json").read_text())["attention_kernels"]
    engine = PackedEngine(load_recipe([str(straight_run / "resolved.yaml")]), torch.device("cpu"))
    blocks = torch.randint(0, engine.recipe.model.vocab_size, (16, engine.recipe.model.context_length + 1))
    executed = dispatched_attention_kernels(lambda: engine.train_step(blocks, 1e-3, 1))
    assert recorded == executed and any("scaled_dot_product" in k for k in recorded)


def test_evaluate_on_a_packed_checkpoint_uses_the_average(straight_run):
    result = json.loads((straight_run / "result.json").read_text())
    recipe = load_recipe([str(straight_run / "resolved.yaml")])
    from_state = evaluate_checkpoint(recipe, straight_run / "final.pt", full=True)
    from_weights = evaluate_checkpoint(recipe, straight_run / "final.safetensors", full=True)
    assert from_state["loss"] == pytest.approx(from_weights["loss"], abs=1e-6)
    final = [r for r in metric_rows(straight_run) if r["event"] != "train"][-1]
    assert from_state["loss"] == pytest.approx(final["loss"], abs=1e-5)
    assert result  # result.json written last


def test_packed_resume_is_bitwise(straight_run, tiny_cache, tiny_recipe_args, tmp_path, monkeypatch):
    run_dir = tmp_path / "resumed"
    recipe = packed_recipe(tiny_cache, tiny_recipe_args, run_dir)
    original = PackedEngine.train_step

    def stop_after_six(self, blocks, lr, step):
        stats = original(self, blocks, lr, step)
        if step == 6:  # between checkpoints: the resume replays updates 5 and 6 from latest.pt
            signals.request_stop()
        return stats

    monkeypatch.setattr(PackedEngine, "train_step", stop_after_six)
    assert run_training(recipe, quiet=True) == 130
    monkeypatch.setattr(PackedEngine, "train_step", original)
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert metric_rows(run_dir) == metric_rows(straight_run)
    for name in ["final.safetensors"] + [f"node-{i:03d}/final.safetensors" for i in range(4)]:
        a, b = load_file(run_dir / name), load_file(straight_run / name)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_changing_topology_on_resume_is_rejected(straight_run, tiny_cache, tiny_recipe_args):
    changed = packed_recipe(tiny_cache, tiny_recipe_args, straight_run, "decentralized.topology=complete")
    with pytest.raises(RunStateError, match="decentralized.topology"):
        run_training(changed, resume=str(straight_run / "final.pt"), quiet=True)


def test_a_non_finite_fused_packed_update_fails_the_run_at_its_own_step(
    tiny_cache, tiny_recipe_args, tmp_path, monkeypatch
):
    """The fused packed update skips update 5 on the device; logging every 2 updates, the loop finds it at
    step 6's row and fails the run at step 5, with the rows before it written (their worker lists read)."""
    original, current = PackedEngine.train_step, [0]

    def numbered(self, blocks, lr, step):
        current[0] = step  # the update whose loss follows (not the attention-kernel probe's pass)
        return original(self, blocks, lr, step)

    def loss(self, inputs, targets):
        local = local_losses(self.model, inputs, targets)
        return local * (float("nan") if current[0] == 5 else 1.0)

    monkeypatch.setattr(PackedEngine, "train_step", numbered)
    monkeypatch.setattr(PackedEngine, "_loss", loss)
    sets = ("runtime.fused_optimizer=true", "training.log_every=2", "training.checkpoint_every=100")
    run_dir = tmp_path / "run"
    assert run_training(packed_recipe(tiny_cache, tiny_recipe_args, run_dir, *sets), quiet=True) == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "failed" and status["step"] == 4
    assert status["error"].startswith("step 5: non-finite loss (local losses [nan, nan, nan, nan]")
    train = [r for r in metric_rows(run_dir) if r["event"] == "train"]
    assert [r["step"] for r in train] == [2, 4] and current[0] == 6
    assert all(len(r["local_losses"]) == 4 and isinstance(r["local_losses"][0], float) for r in train)
