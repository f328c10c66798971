"""`analyze` on trained tiny runs: the data cases, checkpoints, resume after a kill, refusals, packed runs."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import small_recipe

from tiny_llm.analysis.checkpoints import load_saved_weights
from tiny_llm.analysis.data import load_epoch
from tiny_llm.analysis.hessian import FlatParameters, gradient, model_loss
from tiny_llm.analysis.job import AnalysisJob, result_line, run_analysis
from tiny_llm.analysis.names import (
    cache_tokens_needed,
    epoch_checkpoint,
    missing_checkpoints,
    saved_checkpoints,
)
from tiny_llm.analysis.settings import VERSION, AnalysisConfig
from tiny_llm.budget import make_budget
from tiny_llm.cli import main
from tiny_llm.config import load_recipe
from tiny_llm.data.cache import open_cache
from tiny_llm.engines import build_engine
from tiny_llm.errors import DataError, RunStateError
from tiny_llm.io import atomic_write_json
from tiny_llm.model import Llama
from tiny_llm.train import checkpoint, session

FAST = {"noise_samples": 3, "random_samples": 2, "directions_per_pass": 4}
TIMING = {"seconds", "hvp_seconds", "gradient_seconds"}


@dataclasses.dataclass
class TrainedRun:
    run_dir: Path
    recipe: object
    updates: list[torch.Tensor]
    """The blocks of every update, as the training step received them."""


def train_recording(recipe) -> list[torch.Tensor]:
    """Train ``recipe``; the blocks of every update, as the training step received them."""
    updates: list[torch.Tensor] = []

    def recording_engine(recipe, device):
        engine = build_engine(recipe, device)
        step = engine.train_step

        def train_step(blocks, lr, number):
            updates.append(blocks.clone())
            return step(blocks, lr, number)

        engine.train_step = train_step
        return engine

    assert session.run_training(recipe, recording_engine, quiet=True) == 0
    return updates


@pytest.fixture(scope="module")
def trained(tiny_cache, tiny_recipe_args, tmp_path_factory) -> TrainedRun:
    """The deterministic 3-epoch tiny run (28 updates of 16 blocks, epochs end short), every epoch saved."""
    run_dir = tmp_path_factory.mktemp("analysis") / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "training.checkpoint_policy=all")
    return TrainedRun(run_dir, recipe, train_recording(recipe))


def without_timing(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING}


def samples(output: Path) -> dict[str, dict]:
    return {p.name: without_timing(json.loads(p.read_text())) for p in sorted((output / "samples").iterdir())}


# ---------------------------------------------------------------------- checkpoints


def test_planned_checkpoint_names_are_the_files_the_run_saves(trained: TrainedRun) -> None:
    names = saved_checkpoints(trained.recipe)
    assert names == ["epoch-001", "epoch-002", "epoch-003"]
    assert all((trained.run_dir / f"{n}.pt").is_file() for n in names)
    assert [epoch_checkpoint(e) for e in (1, 12, 1234)] == [checkpoint.epoch_stem(e) for e in (1, 12, 1234)]
    assert missing_checkpoints(trained.recipe, ["final", "epoch-003", "epoch-004"]) == ["epoch-004"]
    interval = dataclasses.replace(
        trained.recipe, training=dataclasses.replace(trained.recipe.training, checkpoint_policy="interval")
    )
    assert saved_checkpoints(interval) == ["final"]
    assert missing_checkpoints(interval, ["epoch-001"]) == ["epoch-001"]


def test_state_and_weights_files_give_the_same_checkpoint(trained: TrainedRun) -> None:
    cache = open_cache(trained.recipe.data.cache_dir, verify=False)
    state = load_saved_weights(trained.run_dir, "epoch-002", trained.recipe, cache.identity, workers=False)
    weights = load_saved_weights(
        trained.run_dir, "epoch-002.safetensors", trained.recipe, cache.identity, workers=False
    )
    assert state.path.suffix == ".pt" and weights.path.suffix == ".safetensors"
    assert (state.step, state.epoch, state.tokens) == (weights.step, weights.epoch, weights.tokens)
    assert state.hashes == weights.hashes
    assert state.blocks_per_range == weights.blocks_per_range is not None
    budget = make_budget(trained.recipe)
    assert state.step == sum(len(budget.epoch_updates(e)) for e in range(2))


# ---------------------------------------------------------------------- data cases


def test_seen_replays_the_first_epoch_of_training_batch_by_batch(trained: TrainedRun) -> None:
    cache = open_cache(trained.recipe.data.cache_dir, verify=False)
    epoch = load_epoch(trained.recipe, cache, "seen")
    budget = make_budget(trained.recipe)
    first_epoch = trained.updates[: len(budget.epoch_updates(0))]
    assert [b.num_blocks for b in epoch.batches] == [u.shape[0] for u in first_epoch]
    assert epoch.batches[-1].num_blocks < epoch.batches[0].num_blocks  # the epoch ends with a short update
    for batch, update in zip(epoch.batches, first_epoch, strict=True):
        assert torch.equal(epoch.batch_blocks(batch), update)
    assert epoch.num_blocks == budget.epoch_boundaries[0]


def test_unseen_blocks_are_whole_batches_training_never_used(trained: TrainedRun) -> None:
    cache = open_cache(trained.recipe.data.cache_dir, verify=False)
    epoch = load_epoch(trained.recipe, cache, "unseen")
    budget = make_budget(trained.recipe)
    L = trained.recipe.model.context_length
    assert epoch.first_block == budget.num_blocks
    assert (
        epoch.num_blocks == budget.epoch_boundaries[0] // budget.blocks_per_update * budget.blocks_per_update
    )
    assert {b.num_blocks for b in epoch.batches} == {budget.blocks_per_update}
    tokens = torch.from_numpy(cache.read("train", 0, cache.num_tokens("train")).astype("int64"))
    expected = {
        tuple(tokens[k * L : k * L + L + 1].tolist())
        for k in range(epoch.first_block, epoch.first_block + epoch.num_blocks)
    }
    rows = {tuple(row.tolist()) for row in epoch.blocks}
    assert rows == expected  # a permutation of the blocks right after the budget
    used = {tuple(row.tolist()) for update in trained.updates for row in update}
    assert len(used) == budget.num_blocks and not rows & used


def test_with_data_passes_seen_replays_training_and_unseen_follows_the_unique_blocks(
    tiny_cache, tiny_recipe_args, tmp_path: Path
) -> None:
    """Three passes over 138 unique blocks: the 165-block first epoch runs into the second pass."""
    recipe = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run", "training.data_passes=3")
    budget = make_budget(recipe)
    assert budget.unique_blocks < budget.epoch_boundaries[0]
    updates = train_recording(recipe)
    cache = open_cache(recipe.data.cache_dir, verify=False)
    seen = load_epoch(recipe, cache, "seen")
    first_epoch = updates[: len(budget.epoch_updates(0))]
    assert all(torch.equal(seen.batch_blocks(b), u) for b, u in zip(seen.batches, first_epoch, strict=True))
    unseen = load_epoch(recipe, cache, "unseen")
    assert unseen.first_block == budget.unique_blocks
    used = {tuple(row.tolist()) for update in updates for row in update}
    assert len(used) == budget.unique_blocks
    assert not {tuple(row.tolist()) for row in unseen.blocks} & used


def test_too_small_a_cache_for_the_unseen_case_is_a_clear_error(
    trained: TrainedRun, tiny_recipe_args
) -> None:
    cache = open_cache(trained.recipe.data.cache_dir, verify=False)
    # a budget that fills most of the 200k-token cache: no room for one more epoch after it
    big = load_recipe(
        ["tiny"], [*tiny_recipe_args(trained.recipe.data.cache_dir), "training.tokens_per_parameter=1.4"]
    )
    with pytest.raises(
        DataError, match=r"^cache too small for the unseen case: need \d+ train tokens"
    ) as info:
        load_epoch(big, cache, "unseen")
    assert "\n" not in str(info.value)
    assert f"data.prepare_train_tokens >= {cache_tokens_needed(big)} " in str(
        info.value
    )  # what the plan asks
    assert cache_tokens_needed(big, ("seen",)) == make_budget(big).cache_tokens_needed
    assert load_epoch(big, cache, "seen").num_blocks == make_budget(big).epoch_boundaries[0]


# ---------------------------------------------------------------------- jobs


def test_the_smallest_job_measures_one_direction_of_each_kind(trained: TrainedRun, tmp_path: Path) -> None:
    """The fast tier's whole job: one noise and one random direction (the larger jobs below are slow)."""
    settings = AnalysisConfig(case="seen", noise_samples=1, random_samples=1, directions_per_pass=2)
    result = run_analysis(trained.run_dir, "epoch-001", tmp_path / "one", settings, log=lambda _: None)
    stats = result["statistics"]
    assert (stats["noise_samples"], stats["random_samples"]) == (1, 1)
    assert stats["normalized_noise_alignment"] > 0 and stats["normalized_random_alignment"] > 0
    assert [p.name for p in sorted((tmp_path / "one" / "samples").iterdir())][-1] == "random-0000.json"
    assert json.loads((tmp_path / "one" / "result.json").read_text()) == result


def test_a_directory_measured_by_an_earlier_version_is_refused(trained: TrainedRun, tmp_path: Path) -> None:
    """An analysis directory from before version 2 (no matmul precision, no tf32 setting) belongs to the
    version that made it: the same job refuses it in one line naming the version, and removes nothing."""
    output = tmp_path / "earlier"
    settings = AnalysisConfig(case="seen", noise_samples=1, random_samples=1)
    job = AnalysisJob(trained.run_dir, "epoch-001", output, settings, print)
    earlier = {k: v for k, v in job.identity.items() if k not in ("matmul_precision", "identity")}
    earlier |= {"version": VERSION - 1, "identity": "earlier"}
    earlier["settings"] = {k: v for k, v in earlier["settings"].items() if k != "tf32"}
    (output / "samples").mkdir(parents=True)
    (output / "samples" / "noise-0003.json").write_text("{}")
    atomic_write_json(output / "manifest.json", {"identity_payload": earlier})
    refusal = rf"holds another analysis \(.*version: {VERSION - 1} -> {VERSION}"
    with pytest.raises(RunStateError, match=refusal) as err:
        job.check_output()
    assert "\n" not in str(err.value) and "use a new --output directory" in str(err.value)
    assert [p.name for p in (output / "samples").iterdir()] == ["noise-0003.json"]


@pytest.mark.slow  # two whole analysis jobs (about 10 s of CPU)
def test_job_writes_samples_manifest_and_result_and_reuses_it(trained: TrainedRun, tmp_path: Path) -> None:
    output = tmp_path / "seen"
    settings = AnalysisConfig(case="seen", **FAST)
    result = run_analysis(trained.run_dir, "epoch-002", output, settings, log=lambda _: None)
    stats = result["statistics"]
    assert (stats["noise_samples"], stats["random_samples"]) == (3, 2)
    assert stats["dimension"] == make_budget(trained.recipe).parameters
    assert stats["normalized_noise_alignment"] > 0 and stats["normalized_random_alignment"] > 0
    assert result["checkpoint"]["name"] == "epoch-002" and result["checkpoint"]["step"] == 22
    assert sorted(samples(output)) == [
        *(f"noise-{i:04d}.json" for i in sorted(r["batch"]["index"] for r in _rows(output, "noise"))),
        "random-0000.json",
        "random-0001.json",
    ]
    manifest = json.loads((output / "manifest.json").read_text())
    assert manifest["identity"] == result["identity"] and manifest["data"]["num_batches"] == 11
    assert not (output / "state" / "mean-gradient.pt").exists()
    lines: list[str] = []
    again = run_analysis(trained.run_dir, "epoch-002", output, settings, log=lines.append)
    assert again == result and lines == [f"{output}: already complete"]
    # execution-only settings may change; measured ones may not
    faster = dataclasses.replace(settings, directions_per_pass=1, hvp_batch_size=3)
    assert run_analysis(trained.run_dir, "epoch-002", output, faster, log=lambda _: None) == result
    changed = dataclasses.replace(settings, random_samples=3)
    with pytest.raises(RunStateError, match=r"holds another analysis \(settings\.random_samples: 2 -> 3\)"):
        run_analysis(trained.run_dir, "epoch-002", output, changed, log=lambda _: None)
    with pytest.raises(RunStateError, match="checkpoint: 'epoch-002' -> 'epoch-003'"):
        run_analysis(trained.run_dir, "epoch-003", output, settings, log=lambda _: None)
    # the matmul precision is recorded beside the device and torch version, and a resume may not change it
    assert all(r["matmul_precision"] == "ieee" and r["device"] == "cpu" for r in _rows(output, "noise"))
    assert manifest["matmul_precision"] == result["matmul_precision"] == "ieee" and "torch" in manifest
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("tiny_llm.analysis.job.matmul_precision", lambda recipe, settings: "tf32")
        with pytest.raises(RunStateError, match="matmul_precision: 'ieee' -> 'tf32'"):
            run_analysis(trained.run_dir, "epoch-002", output, settings, log=lambda _: None)
    # the same job after the run was trained again (other weights under the same name): it starts over
    manifest = json.loads((output / "manifest.json").read_text())
    manifest["identity_payload"]["inputs"]["weights_hash"] = "0" * 64
    manifest["identity_payload"]["identity"] = "stale"
    (output / "manifest.json").write_text(json.dumps(manifest))
    lines.clear()
    assert run_analysis(trained.run_dir, "epoch-002", output, settings, log=lines.append) == result | {
        "seconds_this_session": pytest.approx(result["seconds_this_session"], abs=60),
        "seconds": pytest.approx(result["seconds"], rel=10),
    }
    assert "inputs changed since (inputs.weights_hash: '000" in lines[0] and lines[0].endswith(
        "starting over"
    )
    assert "5 of 5 directions to measure" in lines[1]


def _rows(output: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((output / "samples").glob(f"{kind}-*.json"))]


@pytest.mark.slow  # every batch of an epoch as a direction
def test_noise_directions_are_batch_gradients_minus_the_epoch_mean(
    trained: TrainedRun, tmp_path: Path
) -> None:
    output = tmp_path / "unseen"
    settings = AnalysisConfig(case="unseen", noise_samples="all", random_samples=1, directions_per_pass=16)
    result = run_analysis(trained.run_dir, "epoch-001", output, settings, log=lambda _: None)
    noise = _rows(output, "noise")
    assert len(noise) == result["data"]["num_batches"] == result["statistics"]["noise_samples"]
    # with every (equal-size) batch, the mean of the batch gradients is the epoch gradient: sum v = 0, so
    # sum |g|^2 / S = |mean|^2 + sum |v|^2 / S
    mean_sq = result["statistics"]["mean_gradient_norm"] ** 2
    g_sq = sum(r["gradient_norm"] ** 2 for r in noise) / len(noise)
    v_sq = sum(r["noise_norm_squared"] for r in noise) / len(noise)
    assert g_sq == pytest.approx(mean_sq + v_sq, rel=1e-4)
    # the epoch loss is the mean of the batch losses
    assert result["epoch_loss"] == pytest.approx(sum(r["batch_loss"] for r in noise) / len(noise), rel=1e-5)


# `analyze` that SIGKILLs itself right after its third sample file is written: a kill at a known point,
# with no polling race between the test and the job.
KILLED_AFTER_THREE_SAMPLES = """
import os, signal, sys
from tiny_llm.analysis.job import AnalysisJob
from tiny_llm.cli import main

write = AnalysisJob.write_sample


def write_then_die(self, row):
    write(self, row)
    if len(list(self.samples_dir.glob("*.json"))) == 3:
        os.kill(os.getpid(), signal.SIGKILL)


AnalysisJob.write_sample = write_then_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # three whole analysis jobs, two of them in fresh processes
def test_resume_after_a_kill_mid_samples_equals_an_uninterrupted_job(
    trained: TrainedRun, tmp_path: Path
) -> None:
    args = [
        sys.executable, "-m", "tiny_llm", "analyze", "--run", str(trained.run_dir),
        "--checkpoint", "epoch-003", "--case", "seen", "--noise-samples", "4", "--random-samples", "2",
        "--directions-per-pass", "1", "--threads", "1",
    ]  # fmt: skip
    straight = tmp_path / "straight"
    settings = AnalysisConfig(
        case="seen", noise_samples=4, random_samples=2, directions_per_pass=1, threads=1
    )
    done = run_analysis(trained.run_dir, "epoch-003", straight, settings, log=lambda _: None)
    killed = tmp_path / "killed"
    dying = [sys.executable, "-c", KILLED_AFTER_THREE_SAMPLES, *args[3:], "--output", str(killed)]
    process = subprocess.run(dying, capture_output=True, text=True, timeout=300)
    assert process.returncode == -signal.SIGKILL, process.stderr
    written = len(list((killed / "samples").glob("*.json")))
    assert written == 3
    assert (killed / "state" / "mean-gradient.pt").is_file() and not (killed / "result.json").exists()
    resumed = subprocess.run([*args, "--output", str(killed)], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{6 - written} of 6 directions to measure (mean gradient saved)" in resumed.stderr
    assert samples(killed) == samples(straight)
    a, b = (json.loads((d / "result.json").read_text()) for d in (straight, killed))
    assert a["statistics"] == b["statistics"] and a["epoch_loss"] == b["epoch_loss"]
    assert json.loads(resumed.stdout) == json.loads(result_line(done))


def test_cli_errors_are_one_line(trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["analyze", "--run", str(trained.run_dir), "--case", "seen"]
    assert main([*base, "--checkpoint", "epoch-009", "--output", str(tmp_path / "x")]) == 2
    missing = capsys.readouterr().err
    assert missing.count("\n") == 1 and missing.startswith("error: run ")
    assert "no checkpoint 'epoch-009'" in missing and "it has: epoch-001, epoch-002" in missing
    bad = [*base, "--checkpoint", "final", "--output", str(tmp_path / "y"), "--amp", "--dtype", "float64"]
    assert main(bad) == 2
    assert capsys.readouterr().err == "error: --amp: BF16 autocast needs --dtype float32\n"


def test_a_folder_of_a_users_files_is_refused_and_kept(
    trained: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    args = ["analyze", "--run", str(trained.run_dir), "--case", "seen", "--checkpoint", "final"]
    assert main([*args, "--output", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --output {mine} ")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # no lock, no manifest
    assert (mine / "notes.txt").read_text() == "precious"


# ---------------------------------------------------------------------- fast path vs reference path


def test_fast_path_matches_the_reference_path_within_the_spec_bounds(trained: TrainedRun) -> None:
    """BF16 autocast + SDPA (training's fast path) against the FP32 reference attention (SPEC §11):
    logits within 2% relative, the aggregate gradient over an epoch's batches within 5%."""
    cache = open_cache(trained.recipe.data.cache_dir, verify=False)
    saved = load_saved_weights(trained.run_dir, "epoch-003", trained.recipe, cache.identity, workers=False)
    blocks = load_epoch(trained.recipe, cache, "unseen").blocks[:64]
    models = {}
    for reference in (True, False):
        model = Llama(trained.recipe.model, reference_attention=reference)
        model.load_state_dict(saved.weights)
        models[reference] = model
    with torch.no_grad():
        exact = models[True](blocks[:8, :-1])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast = models[False](blocks[:8, :-1]).float()
    assert float((fast - exact).norm() / exact.norm()) < 0.02
    grads = {}
    for reference, amp in ((True, False), (False, True)):
        flat = FlatParameters(list(models[reference].parameters()))
        grads[reference] = gradient(model_loss(models[reference], amp=amp), flat, blocks.split(8), 64 * 64)[0]
    assert float((grads[False] - grads[True]).norm() / grads[True].norm()) < 0.05


# ---------------------------------------------------------------------- packed runs


@pytest.fixture(scope="module")
def packed_run(tiny_cache, tiny_recipe_args, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("analysis-packed") / "run"
    sets = [
        *tiny_recipe_args(tiny_cache),
        "training.tokens_per_parameter=0.125",
        "training.epoch_tokens_per_parameter=0.0625",
        "training.checkpoint_policy=all",
        "evaluation.subset_blocks=16",
        "runtime.cpu_threads=1",
        f"runtime.output_dir={run_dir}",
    ]
    assert session.run_training(load_recipe(["packed4-tiny"], sets), build_engine, quiet=True) == 0
    return run_dir


@pytest.mark.slow  # three whole analysis jobs of a packed run
def test_packed_runs_measure_each_workers_consensus_error(packed_run: Path, tmp_path: Path) -> None:
    settings = AnalysisConfig(case="seen", noise_samples=2, random_samples=1, directions_per_pass=8)
    result = run_analysis(packed_run, "epoch-001", tmp_path / "pt", settings, log=lambda _: None)
    stats = result["statistics"]
    assert stats["consensus_workers"] == 4 and stats["average_consensus_norm"] > 0
    assert result["data"]["num_batches"] == 4 * len(make_budget(_recipe(packed_run)).epoch_updates(0))
    assert {r["batch"]["worker"] for r in _rows(tmp_path / "pt", "noise")} <= {0, 1, 2, 3}
    assert max(result["data"]["batch_blocks"]) == 4  # a worker's share of a 16-block update
    consensus = _rows(tmp_path / "pt", "consensus")
    assert [r["index"] for r in consensus] == [0, 1, 2, 3]
    # the weights files (root average + node-NNN workers) give the same directions as the state's arena
    from_weights = run_analysis(
        packed_run, "epoch-001.safetensors", tmp_path / "safetensors", settings, log=lambda _: None
    )
    for a, b in zip(consensus, _rows(tmp_path / "safetensors", "consensus"), strict=True):
        assert a["norm_squared"] == pytest.approx(b["norm_squared"], rel=1e-6)
        assert a["quadratic"] == pytest.approx(b["quadratic"], rel=1e-4, abs=1e-9)
    assert from_weights["statistics"]["consensus_workers"] == 4
    without = run_analysis(
        packed_run,
        "epoch-001",
        tmp_path / "no-consensus",
        dataclasses.replace(settings, consensus=False),
        log=lambda _: None,
    )
    assert "consensus_workers" not in without["statistics"]


def _recipe(run_dir: Path):
    return load_recipe([str(run_dir / "resolved.yaml")])
