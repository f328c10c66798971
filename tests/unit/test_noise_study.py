"""Where seed noise comes from: training.data_seed apart from runtime.seed, the noise study's plan, its report
and its estimate."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pipeline_helpers import plan_of, shipped
from train_helpers import small_recipe

from tiny_llm.campaign import significance
from tiny_llm.cli import main
from tiny_llm.config import load_recipe, recipe_identity, recipe_identity_payload
from tiny_llm.engines import build_engine
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.io import atomic_write_json, atomic_write_yaml
from tiny_llm.pipeline.noise import noise_seeds
from tiny_llm.report.noise_study import write_noise_report
from tiny_llm.train.loop import Trainer
from tiny_llm.train.metrics import RunLog


def test_the_data_seed_defaults_to_the_run_seed_and_stays_out_of_the_identity() -> None:
    recipe = load_recipe(["tiny"], ["runtime.seed=7"])
    assert recipe.training.data_seed is None and recipe.data_seed == 7
    assert "data_seed" not in recipe_identity_payload(recipe)["training"]  # every existing identity holds
    apart = load_recipe(["tiny"], ["runtime.seed=7", "training.data_seed=3"])
    assert apart.data_seed == 3 and recipe_identity(apart, "c") != recipe_identity(recipe, "c")
    with pytest.raises(ConfigError, match="training.data_seed: must be >= 0 or null, got -1"):
        load_recipe(["tiny"], ["training.data_seed=-1"])


def first_update(recipe, run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh run's first update's blocks and its initial embedding."""
    run_dir.mkdir(parents=True)
    trainer = Trainer(recipe, run_dir, RunLog(run_dir / "run.log", quiet=True), build_engine)
    try:
        trainer.start(None)
        return trainer.loader.next_blocks(4), trainer.engine.eval_model().embed.weight.detach().clone()
    finally:
        trainer.close()


@pytest.mark.slow  # about 3 s: four trainers started on the tiny cache
def test_the_run_seed_sets_the_weights_and_the_data_seed_the_order(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    def run(name: str, *sets: str) -> tuple[torch.Tensor, torch.Tensor]:
        return first_update(
            small_recipe(tiny_cache, tiny_recipe_args, tmp_path / name, *sets), tmp_path / name
        )

    base_blocks, base_weights = run("base", "runtime.seed=1", "training.data_seed=5")
    init_blocks, init_weights = run("init", "runtime.seed=2", "training.data_seed=5")
    data_blocks, data_weights = run("data", "runtime.seed=1", "training.data_seed=6")
    default_blocks, default_weights = run("default", "runtime.seed=5")
    assert torch.equal(init_blocks, base_blocks) and not torch.equal(init_weights, base_weights)
    assert torch.equal(data_weights, base_weights) and not torch.equal(data_blocks, base_blocks)
    assert torch.equal(default_blocks, base_blocks)  # no data_seed: the run seed orders the data


def test_the_groups_draw_seeds_of_their_own() -> None:
    groups = {source: noise_seeds(source, 100, 3) for source in ("init", "data", "both")}
    assert groups["init"] == [(101, 100), (102, 100), (103, 100)]
    assert groups["data"] == [(100, 104), (100, 105), (100, 106)]
    assert groups["both"] == [(107, 107), (108, 108), (109, 109)]


def test_the_demo_plans_nine_study_runs_varying_one_source_at_a_time() -> None:
    plan = plan_of(shipped("workflow_config.yaml"))
    study = plan.noise
    assert {s: len(runs) for s, runs in study.groups.items()} == {"init": 3, "data": 3, "both": 3}
    init = [study.recipes[r] for r in study.groups["init"]]
    data = [study.recipes[r] for r in study.groups["data"]]
    assert len({r.runtime.seed for r in init}) == 3 and {r.data_seed for r in init} == {100}
    assert {r.runtime.seed for r in data} == {100} and len({r.data_seed for r in data}) == 3
    assert study.groups["data"][0] == "demo-s-data-s104"
    assert "results/report/noise/noise.png" in plan.default_targets("noise")
    cluster = plan_of(shipped("config/cluster.yaml"))
    assert len(cluster.noise.recipes) == 24 and cluster.default_targets("noise") == []


def test_the_cluster_study_is_priced_before_anything_runs(capsys: pytest.CaptureFixture) -> None:
    assert main(["noise", "estimate", "--workflow-config", "config/cluster.yaml"]) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert estimate["runs"] == 24 and estimate["tokens_per_second"] == 1636281
    assert estimate["gpu_hours"] == pytest.approx(24 * estimate["tokens_per_run"] / 1636281 / 3600)


def fake_study(root: Path, losses: dict[str, list[float]]) -> list[Path]:
    runs = []
    for source, values in losses.items():
        for i, loss in enumerate(values):
            run = root / f"demo-s-{source}-s{i + 1}"
            atomic_write_yaml(
                run / "resolved.yaml", {"runtime": {"seed": i + 1}, "training": {"data_seed": 0}}
            )
            atomic_write_json(run / "result.json", {"final_validation": {"loss": loss, "bpb": loss / 4}})
            runs.append(run)
    return runs


def test_the_report_gives_each_sources_share_with_its_interval(tmp_path: Path) -> None:
    losses = {"init": [6.60, 6.62, 6.61], "data": [6.50, 6.70, 6.60], "both": [6.55, 6.72, 6.58, 6.66]}
    summary = write_noise_report(fake_study(tmp_path / "runs", losses), tmp_path / "out")
    by = {g["source"]: g for g in summary["groups"]}
    expected = {s.name: s for s in significance.noise_sources(losses, "both")}
    assert by["data"]["share"] == pytest.approx(expected["data"].share)
    assert by["init"]["share"] == pytest.approx(
        statistics.variance(losses["init"]) / statistics.variance(losses["both"])
    )
    assert by["init"]["share_low"] < by["init"]["share"] < by["init"]["share_high"]
    assert summary["sum_of_shares"] == pytest.approx(by["init"]["share"] + by["data"]["share"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| data order only | 3 | 6.600000 ± 0.100000 |" in report
    assert (tmp_path / "out" / "noise.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(DataError, match="not a noise-study run"):
        write_noise_report([tmp_path / "runs" / "demo-s-init-s1", tmp_path / "elsewhere"], tmp_path / "out2")
