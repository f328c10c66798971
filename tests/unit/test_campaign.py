"""Campaign planning, ranking, promotion and identity (torch-free, no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tiny_llm import campaign
from tiny_llm.budget import make_budget
from tiny_llm.campaign.ranking import outcome_from
from tiny_llm.cli import main
from tiny_llm.config import recipe_from_dict
from tiny_llm.errors import ConfigError, RunStateError

CLUSTER_SECTION = {
    "stages": [
        {"size": "20m", "lr": [3e-4, 1e-3, 3e-3], "weight_decay": [0.0, 0.1], "beta2": [0.95]},
        {"size": "50m", "parents": 2, "beta2": [0.95, 0.99]},
        {"size": "90m", "parents": 2},
    ],
    "batch_tokens": {"20m": 131072, "50m": 32768, "90m": 32768},
    "throughput": {"20m": 1_636_281, "50m": 871_826, "90m": 508_930},
}
CLUSTER_SIZES = {name: {"preset": name} for name in ("20m", "50m", "90m")}
MUON_SECTION = {
    "lr": None,
    "momentum": 0.95,
    "nesterov": True,
    "ns_steps": 5,
    "weight_decay": None,
    "adjust_lr_fn": "match_rms_adamw",
}


def cluster(root: str = "results/campaign") -> campaign.CampaignConfig:
    return campaign.parse_campaign(CLUSTER_SECTION, CLUSTER_SIZES, root)


def tiny_config(tmp_path: Path, **section_extra) -> campaign.CampaignConfig:
    """Three tiny sizes on a (fake) prepared cache under tmp_path."""
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "manifest.json").write_text(json.dumps({"identity": "cache-abc"}))
    base = {"data": {"cache_dir": str(cache)}}
    sizes = {
        "s": {"preset": "tiny", "overrides": base},
        "m": {"preset": "tiny", "overrides": {**base, "model": {"num_layers": 3}}},
        "l": {"preset": "tiny", "overrides": {**base, "model": {"num_layers": 4}}},
    }
    section = {
        "stages": [
            {"size": "s", "lr": [3e-4, 1e-3, 3e-3], "weight_decay": [0.0, 0.1]},
            {"size": "m", "parents": 2, "beta2": [0.95, 0.99]},
            {"size": "l", "parents": 2},
        ],
        "overrides": {"training": {"checkpoint_policy": "interval"}},
        **section_extra,
    }
    return campaign.parse_campaign(section, sizes, str(tmp_path / "campaign"))


def test_cluster_campaign_has_the_twelve_reference_runs():
    runs = campaign.planned_runs(cluster())
    assert [r.run_id for r in runs["stage1"]] == [
        "20m-lr0.0003-wd0",
        "20m-lr0.0003-wd0.1",
        "20m-lr0.001-wd0",
        "20m-lr0.001-wd0.1",
        "20m-lr0.003-wd0",
        "20m-lr0.003-wd0.1",
    ]
    assert [r.run_id for r in runs["stage2"]] == [
        "50m-parent0-beta2-0.95",
        "50m-parent0-beta2-0.99",
        "50m-parent1-beta2-0.95",
        "50m-parent1-beta2-0.99",
    ]
    assert [r.run_id for r in runs["stage3"]] == ["90m-parent0", "90m-parent1"]
    assert sum(len(v) for v in runs.values()) == 12


def test_stage1_recipes_carry_grid_batch_and_run_dir():
    config = cluster()
    templates = campaign.load_templates(config)
    recipes = campaign.stage1_recipes(config, templates["20m"])
    recipe = recipes["20m-lr0.0003-wd0.1"]
    assert recipe["optimizer"]["lr"] == 3e-4
    assert recipe["optimizer"]["weight_decay"] == 0.1
    assert recipe["optimizer"]["beta2"] == 0.95  # the grid's, not the preset's 0.98
    assert recipe["training"]["batch_tokens"] == 131072
    assert recipe["runtime"]["output_dir"] == "results/campaign/stage1/20m-lr0.0003-wd0.1"
    assert recipe["model"]["num_layers"] == 8
    assert recipe_from_dict(recipe).optimizer.lr == 3e-4  # a complete, valid recipe


def outcome(run, loss, lr=1e-3, wd=0.1, beta2=0.95):
    return campaign.RunOutcome(run, loss, lr, wd, beta2)


def test_rank_by_loss_then_lr_then_decay_then_beta2():
    runs = [
        outcome("worse", 3.1),
        outcome("high-lr", 3.0, lr=3e-3),
        outcome("low-lr-high-wd", 3.0, lr=1e-3, wd=0.1),
        outcome("low-lr-low-wd-high-b2", 3.0, lr=1e-3, wd=0.0, beta2=0.99),
        outcome("low-lr-low-wd-low-b2", 3.0, lr=1e-3, wd=0.0, beta2=0.95),
        outcome("best", 2.9, lr=3e-3),
        outcome("no-loss", math.inf, lr=1e-4),
    ]
    ranked = [o.run_id for o in campaign.rank_runs(runs)]
    assert ranked == [
        "best",
        "low-lr-low-wd-low-b2",
        "low-lr-low-wd-high-b2",
        "low-lr-high-wd",
        "high-lr",
        "worse",
        "no-loss",
    ]


def test_a_child_of_a_muon_parent_keeps_its_muon_section_but_the_lr_its_stage_varies():
    section = {
        "stages": [
            {"size": "20m", "points": [{"lr": 1e-3, "name": "muon", "muon_lr": 2e-3}]},
            {"size": "50m", "parents": 1, "points": [{"muon_lr": 4e-3}]},
        ]
    }
    config = campaign.parse_campaign(section, CLUSTER_SIZES, "results/campaign")
    templates = campaign.load_templates(config)
    parent = campaign.stage1_recipes(config, templates["20m"])["20m-lr0.001-muon-mlr0.002"]
    assert parent["optimizer"]["muon"] == {**MUON_SECTION, "lr": 2e-3}
    parent["optimizer"]["muon"]["momentum"] = 0.9  # what a parent may hold beside its stage's values
    (child,) = campaign.child_recipes(config, 1, templates["50m"], [parent]).values()
    assert child["optimizer"] == {**parent["optimizer"], "muon": {**parent["optimizer"]["muon"], "lr": 4e-3}}


def test_final_loss_reads_full_validation_and_ranks_missing_last():
    assert campaign.final_loss({"final_validation": {"loss": 3.25}}) == 3.25
    assert campaign.final_loss({"final_validation": None}) == math.inf
    assert campaign.final_loss({"best_subset_loss": 1.0}) == math.inf  # never the subset loss


def test_children_copy_the_parents_whole_optimizer_block():
    config = cluster()
    templates = campaign.load_templates(config)
    parent0 = {"optimizer": {**templates["50m"]["optimizer"], "lr": 3e-3, "eps": 1e-6, "grad_clip": 0.5}}
    parent1 = {"optimizer": {**templates["50m"]["optimizer"], "lr": 3e-4, "weight_decay": 0.0}}
    children = campaign.child_recipes(config, 1, templates["50m"], [parent0, parent1])
    child = children["50m-parent0-beta2-0.99"]
    assert child["optimizer"] == {**parent0["optimizer"], "beta2": 0.99}
    assert children["50m-parent1-beta2-0.95"]["optimizer"]["weight_decay"] == 0.0
    assert child["model"]["num_layers"] == 10 and child["training"]["batch_tokens"] == 32768
    assert child["runtime"]["output_dir"] == "results/campaign/stage2/50m-parent0-beta2-0.99"
    last = campaign.child_recipes(config, 2, templates["90m"], [child, parent1])
    assert last["90m-parent0"]["optimizer"] == child["optimizer"]  # stage 3 copies without a grid
    with pytest.raises(RunStateError, match="needs 2 parents"):
        campaign.child_recipes(config, 2, templates["90m"], [child])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["stages"][0].update(size="7m"), "unknown size '7m'"),
        (lambda s: s["stages"][1].update(parents=7), "exceeds the 6 configurations of stage1"),
        (lambda s: s["stages"][0].update(lr=[1e-3, "x"]), r"lr\[1\]: expected a number, got str .x."),
        (lambda s: s["stages"][0].update(lr=[0.0]), r"campaign.stages\[0\].lr\[0\]: must be > 0, got 0"),
        (lambda s: s["stages"][1].update(lrs=[1e-3]), "unknown key"),
        (lambda s: s["stages"][0].update(seeds=[42, 42]), "values repeat"),
        (lambda s: s["stages"][0].update(seeds=[-1]), r"stages\[0\].seeds\[0\]: must be >= 0, got -1"),
        (lambda s: s["stages"][0].update(points=[{"lr": 1e-3}]), "either points or lists"),
        (lambda s: s["batch_tokens"].update({"1b": 4}), "not in campaign.stages"),
        (lambda s: s.update(stages=[]), "non-empty list"),
    ],
)
def test_bad_campaign_settings_are_rejected(mutate, message):
    section = json.loads(json.dumps(CLUSTER_SECTION))
    mutate(section)
    with pytest.raises(ConfigError, match=message):
        campaign.parse_campaign(section, CLUSTER_SIZES, "results/campaign")


def test_settings_round_trip():
    config = cluster()
    again = campaign.config_from_settings(json.loads(json.dumps(campaign.settings_dict(config))))
    assert again == config


def test_gpu_hour_estimate_is_runs_times_tokens_over_rate():
    config = cluster()
    templates = campaign.load_templates(config)
    estimate = campaign.gpu_hour_estimate(config, templates, config.throughput)
    first = estimate["stages"][0]
    tokens = make_budget(recipe_from_dict(templates["20m"])).tokens
    assert first["runs"] == 6 and first["tokens_per_run"] == tokens
    assert first["gpu_hours"] == pytest.approx(6 * tokens / 1_636_281 / 3600)
    assert estimate["total_gpu_hours"] == pytest.approx(sum(s["gpu_hours"] for s in estimate["stages"]))
    unknown = campaign.gpu_hour_estimate(config, templates, {"20m": 1e6})
    assert unknown["total_gpu_hours"] is None and unknown["stages"][1]["gpu_hours"] is None


def test_tuning_result_sets_micro_and_compile_but_not_numerics(tmp_path):
    tuned = tmp_path / "cpu-tuning" / "selected.yaml"
    tuned.parent.mkdir()
    recipe = campaign.size_base({"preset": "tiny"}, "s")
    recipe["training"].update(micro_batch_size=4, batch_tokens=1024)
    recipe["runtime"].update(compile=True, cpu_threads=2)
    recipe["optimizer"]["lr"] = 0.5
    tuned.write_text(yaml.safe_dump(recipe))
    (tuned.parent / "summary.json").write_text(json.dumps({"selected": {"tokens_per_second": 1234.5}}))
    config = tiny_config(tmp_path, tuning={"s": str(tuned)})
    templates = campaign.load_templates(config)
    s = templates["s"]
    assert s["training"]["micro_batch_size"] == 4 and s["runtime"]["compile"] is True
    assert s["runtime"]["cpu_threads"] == 2
    assert s["optimizer"]["lr"] == 0.003  # numerics untouched
    assert templates["m"]["training"]["micro_batch_size"] == 8  # untuned sizes keep the preset
    assert campaign.make_plan(config).estimate["stages"][0]["tokens_per_second"] == 1234.5
    other = tiny_config(tmp_path, tuning={"m": str(tuned)})  # a 2-layer result for the 3-layer size
    with pytest.raises(ConfigError, match=r"campaign.tuning.m: .* tuned another model shape"):
        campaign.load_templates(other)


def test_tuning_result_measured_at_another_batch_is_refused(tmp_path):
    """The fastest microbatch at 512 tokens per update says little about the runs' 1,024 tokens."""
    tuned = tmp_path / "cpu-tuning" / "selected.yaml"
    tuned.parent.mkdir()
    recipe = campaign.size_base({"preset": "tiny"}, "s")
    recipe["training"].update(micro_batch_size=4, batch_tokens=512)
    tuned.write_text(yaml.safe_dump(recipe))
    config = tiny_config(tmp_path, tuning={"s": str(tuned)})
    with pytest.raises(ConfigError) as err:
        campaign.load_templates(config)
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"campaign.tuning.s: {tuned} was measured at training.batch_tokens=512")
    assert "size 's' trains at 1024" in message
    same = tiny_config(tmp_path, tuning={"s": str(tuned)}, batch_tokens={"s": 512})  # campaign at 512: fine
    assert campaign.load_templates(same)["s"]["training"]["micro_batch_size"] == 4


def run_cli(*args: str) -> int:
    return main(list(args))


def settings_arg(config: campaign.CampaignConfig) -> str:
    return json.dumps(campaign.settings_dict(config))


def fake_results(config: campaign.CampaignConfig, stage: str, losses: dict[str, float]) -> None:
    for run_id, loss in losses.items():
        run = Path(campaign.run_dir(config, stage, run_id))
        run.mkdir(parents=True, exist_ok=True)
        (run / "result.json").write_text(json.dumps({"final_validation": {"loss": loss}}))


def test_plan_select_rank_through_the_cli(tmp_path, capsys):
    config = tiny_config(tmp_path)
    settings = settings_arg(config)
    assert run_cli("campaign", "plan", "--settings", settings) == 0
    assert "campaign total: unknown" in capsys.readouterr().out  # no throughput configured
    root = Path(config.root)
    record = json.loads((root / "campaign.json").read_text())
    assert record["cache_identities"] == {"s": "cache-abc", "m": "cache-abc", "l": "cache-abc"}
    assert [len(s["runs"]) for s in record["stages"]] == [6, 4, 2]
    assert len(list((root / "stage1").glob("*/recipe.yaml"))) == 6
    # stage 1 not finished -> select refuses, naming the missing file
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2") == 2
    assert "stage1 is not finished" in capsys.readouterr().err
    losses = {"s-lr0.0003-wd0": 5.0, "s-lr0.0003-wd0.1": 4.0, "s-lr0.001-wd0": 3.5}
    losses |= {"s-lr0.001-wd0.1": 3.5, "s-lr0.003-wd0": 4.5, "s-lr0.003-wd0.1": 6.0}
    fake_results(config, "stage1", losses)
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2") == 0
    ranking = json.loads((root / "stage1" / "ranking.json").read_text())
    assert [r["run"] for r in ranking[:3]] == ["s-lr0.001-wd0", "s-lr0.001-wd0.1", "s-lr0.0003-wd0.1"]
    child = yaml.safe_load((root / "stage2" / "m-parent1-beta2-0.99" / "recipe.yaml").read_text())
    assert child["optimizer"]["lr"] == 1e-3 and child["optimizer"]["weight_decay"] == 0.1
    assert child["optimizer"]["beta2"] == 0.99 and child["model"]["num_layers"] == 3
    assert child["training"]["checkpoint_policy"] == "interval"
    # --run writes exactly one child's recipe (the workflow's select_run job)
    (root / "stage2" / "m-parent1-beta2-0.99" / "recipe.yaml").unlink()
    (root / "stage2" / "m-parent0-beta2-0.95" / "recipe.yaml").unlink()
    run = "m-parent1-beta2-0.99"
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2", "--run", run) == 0
    assert yaml.safe_load((root / "stage2" / run / "recipe.yaml").read_text()) == child
    assert not (root / "stage2" / "m-parent0-beta2-0.95" / "recipe.yaml").exists()
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2", "--run", "nope") == 2
    assert "--run: 'nope' is not a run of stage 2" in capsys.readouterr().err
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2") == 0
    fake_results(config, "stage2", {r: 3.0 + i for i, r in enumerate(record["stages"][1]["runs"])})
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "3") == 0
    fake_results(config, "stage3", {"l-parent0": 2.5, "l-parent1": 2.4})
    assert run_cli("campaign", "rank", "--settings", settings, "--stage", "3") == 0
    final = json.loads((root / "stage3" / "ranking.json").read_text())
    assert [r["run"] for r in final] == ["l-parent1", "l-parent0"]


def test_changed_settings_are_rejected(tmp_path, capsys):
    config = tiny_config(tmp_path)
    assert run_cli("campaign", "plan", "--settings", settings_arg(config)) == 0
    assert run_cli("campaign", "plan", "--settings", settings_arg(config)) == 0  # same settings: fine
    campaign.precheck(config)
    changed = tiny_config(tmp_path, overrides={"optimizer": {"min_lr_ratio": 0.2}})
    with pytest.raises(campaign.CampaignChangedError, match="min_lr_ratio"):
        campaign.precheck(changed)
    assert run_cli("campaign", "plan", "--settings", settings_arg(changed)) == 2
    err = capsys.readouterr().err
    assert "campaign settings changed; use a new output directory" in err and "min_lr_ratio" in err
    # execution-only settings (threads, checkpointing) do not change the campaign
    same = tiny_config(
        tmp_path, overrides={"training": {"checkpoint_policy": "all"}, "runtime": {"cpu_threads": 1}}
    )
    campaign.precheck(same)
    # neither does a different cache
    (tmp_path / "cache" / "manifest.json").write_text(json.dumps({"identity": "cache-other"}))
    with pytest.raises(campaign.CampaignChangedError, match="cache_identities"):
        campaign.precheck(config)


def test_plan_without_a_prepared_cache_says_so(tmp_path, capsys):
    config = tiny_config(tmp_path)
    (tmp_path / "cache" / "manifest.json").unlink()
    assert run_cli("campaign", "plan", "--settings", settings_arg(config)) == 2
    assert "token cache not prepared" in capsys.readouterr().err


def test_plan_needs_the_complete_validation_split_unless_truncated_on_purpose(tmp_path, capsys):
    config = tiny_config(tmp_path)
    manifest = {"identity": "cache-abc", "validation_complete": False}
    (tmp_path / "cache" / "manifest.json").write_text(json.dumps(manifest))
    assert run_cli("campaign", "plan", "--settings", settings_arg(config)) == 2
    err = capsys.readouterr().err
    assert "holds only part of the validation split" in err and len(err.strip().splitlines()) == 1
    truncated = tiny_config(tmp_path, overrides={"data": {"prepare_validation_tokens": 4096}})
    (tmp_path / "cache" / "manifest.json").write_text(json.dumps(manifest))
    assert run_cli("campaign", "plan", "--settings", settings_arg(truncated)) == 0


def test_estimate_without_a_cache_uses_reference_throughput(capsys):
    """The cluster campaign's estimate from the reference GH200 tokens/s, before C4 is prepared."""
    settings = json.dumps(campaign.settings_dict(cluster()))
    assert run_cli("campaign", "estimate", "--settings", settings) == 0
    captured = capsys.readouterr()
    estimate = json.loads(captured.out)
    tokens = [s["tokens_per_run"] for s in estimate["stages"]]
    assert tokens[0] == 408_071_168  # the reference's 20M budget: 398,507 blocks of 1,024
    expected = (6 * tokens[0] / 1_636_281 + 4 * tokens[1] / 871_826 + 2 * tokens[2] / 508_930) / 3600
    assert estimate["total_gpu_hours"] == pytest.approx(expected)
    assert "campaign total:" in captured.err


def test_estimate_straight_from_the_cluster_workflow_config(capsys):
    cluster_yaml = Path(__file__).resolve().parents[2] / "config" / "cluster.yaml"
    assert run_cli("campaign", "estimate", "--workflow-config", str(cluster_yaml)) == 0
    estimate = json.loads(capsys.readouterr().out)
    assert [(s["size"], s["runs"]) for s in estimate["stages"]] == [("20m", 6), ("50m", 4), ("90m", 2)]
    assert estimate["stages"][2]["tokens_per_run"] == 1_832_102_912
    assert run_cli("campaign", "plan", "--workflow-config", str(cluster_yaml)) == 2
    assert "only for 'estimate'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("exit_code", "status", "recorded"),
    [
        (
            1,
            {"status": "failed", "step": 7, "tokens": 70, "error": "step 7: non-finite loss (loss nan)"},
            True,
        ),
        (1, {"status": "failed", "step": 7, "tokens": 70, "error": "RuntimeError: out of memory"}, False),
        (130, {"status": "interrupted", "step": 7, "tokens": 70}, False),
        (2, None, False),
    ],
)
def test_only_a_diverged_run_becomes_a_result(tmp_path, exit_code, status, recorded):
    run = tmp_path / "run"
    run.mkdir()
    if status:
        (run / "status.json").write_text(json.dumps(status))
    result = campaign.diverged_result(run, exit_code)
    assert (result is not None) == recorded
    if recorded:
        assert result["status"] == "diverged" and campaign.final_loss(result) == math.inf
        assert result["step"] == 7 and result["error"] == status["error"]


def test_train_records_only_a_divergence_as_a_result(tmp_path):
    from tiny_llm.commands.train import record_divergence

    run = tmp_path / "run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": "failed", "error": "crash", "step": 2}))
    assert record_divergence(run, 1) == 1 and not (run / "result.json").exists()
    status = {"status": "failed", "error": "non-finite loss at step 3", "step": 3, "tokens": 96}
    (run / "status.json").write_text(json.dumps(status))
    assert record_divergence(run, 130) == 130  # an interruption is not an outcome
    assert record_divergence(run, 1) == 0
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "diverged" and result["step"] == 3
    assert campaign.final_loss(result) == math.inf


# ----------------------------------------------------------------------------- seeds


def seeded_section() -> dict:
    return {
        "stages": [
            {"size": "20m", "lr": [1e-3, 3e-3], "seeds": [42, 43, 44]},
            {"size": "50m", "parents": 1, "beta2": [0.95, 0.99]},  # keeps the seeds of stage 1
            {"size": "90m", "parents": 2, "seeds": [7]},
        ],
        "throughput": {"20m": 1_636_281, "50m": 871_826, "90m": 508_930},
    }


def test_seed_expansion_gives_the_exact_job_list():
    config = campaign.parse_campaign(seeded_section(), CLUSTER_SIZES, "results/campaign")
    runs = campaign.planned_runs(config)
    assert [r.run_id for r in runs["stage1"]] == [
        "20m-lr0.001-wd0.1-s42",
        "20m-lr0.001-wd0.1-s43",
        "20m-lr0.001-wd0.1-s44",
        "20m-lr0.003-wd0.1-s42",
        "20m-lr0.003-wd0.1-s43",
        "20m-lr0.003-wd0.1-s44",
    ]
    assert [r.run_id for r in runs["stage2"]] == [
        f"50m-parent0-beta2-{b}-s{seed}" for b in ("0.95", "0.99") for seed in (42, 43, 44)
    ]
    assert [r.run_id for r in runs["stage3"]] == ["90m-parent0-s7", "90m-parent1-s7"]
    assert {r.configuration for r in runs["stage2"]} == {"50m-parent0-beta2-0.95", "50m-parent0-beta2-0.99"}
    assert campaign.configuration_runs(config, "stage3") == {
        "90m-parent0": ["90m-parent0-s7"],
        "90m-parent1": ["90m-parent1-s7"],
    }
    # a later stage may promote at most the configurations (not the runs) of the stage before
    too_many = seeded_section()
    too_many["stages"][1]["parents"] = 3
    with pytest.raises(ConfigError, match="3 exceeds the 2 configurations of stage1"):
        campaign.parse_campaign(too_many, CLUSTER_SIZES, "results/campaign")
    # each seed is its own recipe: runtime.seed and run directory
    recipes = campaign.stage1_recipes(config, campaign.load_templates(config)["20m"])
    recipe = recipes["20m-lr0.003-wd0.1-s43"]
    assert recipe["runtime"]["seed"] == 43 and recipe["optimizer"]["lr"] == 3e-3
    assert recipe["runtime"]["output_dir"] == "results/campaign/stage1/20m-lr0.003-wd0.1-s43"
    estimate = campaign.gpu_hour_estimate(config, campaign.load_templates(config), config.throughput)
    assert [(s["configurations"], s["seeds"], s["runs"]) for s in estimate["stages"]] == [
        (2, 3, 6),
        (2, 3, 6),
        (2, 1, 2),
    ]
    assert "stage1: 6 (2 configurations x 3 seeds) x 20m" in campaign.describe_estimate(estimate)


def test_without_seeds_run_ids_settings_and_identity_are_unchanged():
    """Seeds left out (their default) keep the run ids, recipes and campaign identity of a campaign without
    the key: a new setting at its default changes no identity."""
    config = cluster()
    assert campaign.settings_dict(config)["stages"] == [
        {"size": "20m", "lr": [3e-4, 1e-3, 3e-3], "weight_decay": [0.0, 0.1], "beta2": [0.95]},
        {"size": "50m", "beta2": [0.95, 0.99], "parents": 2},
        {"size": "90m", "parents": 2},
    ]
    recipe = campaign.stage1_recipes(config, campaign.load_templates(config)["20m"])["20m-lr0.001-wd0.1"]
    assert recipe["runtime"]["seed"] == 42  # the template's
    assert all(
        r.seed is None and r.configuration == r.run_id
        for rs in campaign.planned_runs(config).values()
        for r in rs
    )


def seeded_outcome(run, loss, config, seed, lr=1e-3, wd=0.1, beta2=0.95, beta1=0.9):
    return campaign.RunOutcome(run, loss, lr, wd, beta2, beta1, config, seed)


def seeds_of(config, losses, **optimizer):
    return [seeded_outcome(f"{config}-s{i}", loss, config, i, **optimizer) for i, loss in enumerate(losses)]


def test_configurations_rank_by_mean_then_lr_weight_decay_beta1_beta2():
    """Hand-made losses (exact in binary, so the ties are real ties)."""
    outcomes = [
        *seeds_of("best-single-seed", [2.0, 5.0]),  # mean 3.5: the best run, but not the best mean
        *seeds_of("tie-high-lr", [3.25, 3.25], lr=3e-3),
        *seeds_of("tie-low-lr-b1", [3.25, 3.25], lr=1e-3, beta1=0.95, beta2=0.95),
        *seeds_of("tie-low-lr-b2", [3.0, 3.5], lr=1e-3, beta2=0.99),
        *seeds_of("tie-low-lr-wd", [3.25, 3.25], lr=1e-3, wd=0.0, beta1=0.99, beta2=0.999),
        *seeds_of("tie-lowest-lr", [2.5, 4.0], lr=1e-4),
        *seeds_of("steady", [3.125, 3.125], lr=3e-3),
    ]
    ranked = campaign.rank_configurations(outcomes)
    assert [c.configuration for c in ranked] == [
        "steady",  # lowest mean
        "tie-lowest-lr",  # mean 3.25 from here: lower lr first
        "tie-low-lr-wd",  # lr 1e-3: weight decay 0 before 0.1
        "tie-low-lr-b2",  # lr 1e-3, wd 0.1: beta1 0.9 before 0.95 (beta2 comes after beta1)
        "tie-low-lr-b1",
        "tie-high-lr",
        "best-single-seed",
    ]
    assert [c.mean for c in ranked[:2]] == [3.125, 3.25]


def test_aggregates_are_mean_and_sample_sd():
    mean, sd = campaign.loss_summary([3.0, 3.2, 3.4])
    assert mean == pytest.approx(3.2) and sd == pytest.approx(0.2)  # sample SD (n - 1), not population
    assert campaign.loss_summary([3.5]) == (3.5, None)  # n = 1: no SD
    assert campaign.loss_summary([3.5, math.inf]) == (None, None)  # a diverged seed: no mean
    ranked = campaign.rank_configurations(
        seeds_of("a", [3.558, 3.5636, 3.5545], lr=5.6e-3, beta2=0.98) + seeds_of("b", [3.6], lr=4e-3)
    )
    rows = campaign.ranking_rows(ranked)
    assert (
        rows[0]["configuration"] == "a" and rows[0]["n"] == 3 and rows[0]["runs"] == ["a-s0", "a-s1", "a-s2"]
    )
    assert rows[0]["loss"] == pytest.approx(3.558700, abs=1e-6)
    # deviations -0.0007, 0.0049, -0.0042: sqrt((4.9e-7 + 2.401e-5 + 1.764e-5) / 2) = 0.0045902
    assert rows[0]["loss_sd"] == pytest.approx(0.0045902, abs=1e-7)
    assert rows[0]["run"] == "a-s2"  # the best seed: what an export of the stage's best reads
    assert {
        k: rows[1][k] for k in ("rank", "configuration", "run", "loss", "loss_sd", "n", "run_losses")
    } == {
        "rank": 1,
        "configuration": "b",
        "run": "b-s0",
        "loss": 3.6,
        "loss_sd": None,
        "n": 1,
        "run_losses": [3.6],
    }


def test_a_diverged_seed_counts_as_the_worst_loss_of_its_configuration():
    outcomes = [
        *seeds_of("one-diverged", [3.0, math.inf], lr=1e-4),  # its finished seed is the best of all
        *seeds_of("worse", [3.9, 4.1]),
        *seeds_of("both-diverged", [math.inf, math.inf], lr=1e-5),
        *seeds_of("one-diverged-worse", [3.5, math.inf], lr=1e-5),
    ]
    ranked = campaign.rank_configurations(outcomes)
    assert [c.configuration for c in ranked] == [
        "worse",
        "one-diverged",
        "one-diverged-worse",
        "both-diverged",
    ]
    rows = campaign.ranking_rows(ranked)
    assert rows[1]["loss"] is None and rows[1]["diverged"] == ["one-diverged-s1"]
    assert rows[1]["run"] == "one-diverged-s0" and rows[1]["run_losses"] == [3.0, None]


def test_select_promotes_a_configuration_with_all_its_seeds(tmp_path, capsys):
    config = tiny_config(tmp_path)
    section = {
        "stages": [
            {"size": "s", "lr": [1e-3, 3e-3], "seeds": [1, 2]},
            {"size": "m", "parents": 1, "beta2": [0.99]},
        ],
    }
    sizes = {k: dict(v) for k, v in config.sizes.items() if k in ("s", "m")}
    config = campaign.parse_campaign(section, sizes, str(tmp_path / "seeded"))
    settings = settings_arg(config)
    assert run_cli("campaign", "plan", "--settings", settings) == 0
    record = json.loads((Path(config.root) / "campaign.json").read_text())
    assert record["stages"][0]["configurations"] == {
        "s-lr0.001-wd0.1": ["s-lr0.001-wd0.1-s1", "s-lr0.001-wd0.1-s2"],
        "s-lr0.003-wd0.1": ["s-lr0.003-wd0.1-s1", "s-lr0.003-wd0.1-s2"],
    }
    assert record["stages"][1]["runs"] == ["m-parent0-beta2-0.99-s1", "m-parent0-beta2-0.99-s2"]
    assert record["stages"][1]["seeds"] == [1, 2]
    # lr 0.001 has the best single seed, lr 0.003 the best mean: the mean decides
    losses = {"s-lr0.001-wd0.1-s1": 3.0, "s-lr0.001-wd0.1-s2": 4.0}
    losses |= {"s-lr0.003-wd0.1-s1": 3.4, "s-lr0.003-wd0.1-s2": 3.4}
    fake_results(config, "stage1", losses)
    capsys.readouterr()
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2") == 0
    out = capsys.readouterr().out
    assert "stage1 best: s-lr0.003-wd0.1 (mean loss 3.400000 +- 0.000000 over 2 seeds)" in out
    for seed in (1, 2):
        child = yaml.safe_load(
            (Path(config.root) / f"stage2/m-parent0-beta2-0.99-s{seed}/recipe.yaml").read_text()
        )
        assert child["optimizer"]["lr"] == 3e-3 and child["optimizer"]["beta2"] == 0.99
        assert child["runtime"]["seed"] == seed and child["model"]["num_layers"] == 3
    ranking = json.loads((Path(config.root) / "stage1/ranking.json").read_text())
    assert [(r["configuration"], r["loss"], r["n"]) for r in ranking] == [
        ("s-lr0.003-wd0.1", 3.4, 2),
        ("s-lr0.001-wd0.1", 3.5, 2),
    ]


# ----------------------------------------------------------------------------- wider grids


def test_any_stage_varies_lr_weight_decay_beta1_and_beta2_as_a_full_product():
    section = {
        "stages": [
            {"size": "20m", "lr": [1e-3, 3e-3], "beta1": [0.9, 0.95], "beta2": [0.95, 0.99]},
            {"size": "50m", "parents": 2, "lr": [1e-3], "weight_decay": [0.0, 0.1]},
        ]
    }
    config = campaign.parse_campaign(section, CLUSTER_SIZES, "results/campaign")
    runs = campaign.planned_runs(config)
    assert [r.run_id for r in runs["stage1"]] == [
        f"20m-lr{lr}-wd0.1-beta1-{b1}-beta2-{b2}"
        for lr in ("0.001", "0.003")
        for b1 in ("0.9", "0.95")
        for b2 in ("0.95", "0.99")
    ]
    assert runs["stage1"][-1].optimizer == {"lr": 3e-3, "weight_decay": 0.1, "beta1": 0.95, "beta2": 0.99}
    # a later stage crosses every parent with its own lists (each listed key names the run, as beta2 did)
    assert [r.run_id for r in runs["stage2"]] == [
        f"50m-parent{rank}-lr0.001-wd{wd}" for rank in (0, 1) for wd in ("0", "0.1")
    ]
    templates = campaign.load_templates(config)
    parent = {"optimizer": {**templates["50m"]["optimizer"], "lr": 3e-3, "beta1": 0.95, "beta2": 0.99}}
    children = campaign.child_recipes(config, 1, templates["50m"], [parent, parent])
    child = children["50m-parent1-lr0.001-wd0"]["optimizer"]
    assert child == {**parent["optimizer"], "lr": 1e-3, "weight_decay": 0.0}  # the rest is the parent's


def test_explicit_points_instead_of_a_product():
    section = {
        "stages": [
            {
                "size": "20m",
                "points": [{"lr": 1e-3, "beta2": 0.95}, {"lr": 5.6e-3, "beta2": 0.98}],
                "seeds": [1, 2],
            },
            {"size": "50m", "parents": 1, "points": [{"beta1": 0.95}, {"lr": 2e-3, "weight_decay": 0.0}]},
        ]
    }
    config = campaign.parse_campaign(section, CLUSTER_SIZES, "results/campaign")
    runs = campaign.planned_runs(config)
    assert [r.run_id for r in runs["stage1"]] == [
        "20m-lr0.001-beta2-0.95-s1",
        "20m-lr0.001-beta2-0.95-s2",
        "20m-lr0.0056-beta2-0.98-s1",
        "20m-lr0.0056-beta2-0.98-s2",
    ]
    recipes = campaign.stage1_recipes(config, campaign.load_templates(config)["20m"])
    point = recipes["20m-lr0.0056-beta2-0.98-s2"]["optimizer"]
    assert (point["lr"], point["beta2"], point["weight_decay"]) == (
        5.6e-3,
        0.98,
        0.1,
    )  # the rest: the preset's
    assert [r.run_id for r in runs["stage2"]][::2] == [
        "50m-parent0-beta1-0.95-s1",
        "50m-parent0-lr0.002-wd0-s1",
    ]
    again = campaign.config_from_settings(json.loads(json.dumps(campaign.settings_dict(config))))
    assert again == config
    for bad, message in [
        ([{"lr": 1e-3}, {"lr": 1e-3}], "values repeat"),
        ([{"momentum": 0.9}], "unknown key"),
        ([{"beta2": 1.0}], r"points\[0\].beta2: must be in \[0, 1\) or null, got 1"),
        ([], "non-empty list"),
    ]:
        broken = json.loads(json.dumps(section))
        broken["stages"][0]["points"] = bad
        with pytest.raises(ConfigError, match=message):
            campaign.parse_campaign(broken, CLUSTER_SIZES, "results/campaign")


def test_points_may_set_the_optimizer_name_and_muon_lr():
    """name and muon_lr (the optimizer's muon.lr) join a point's run id only where set (name adamw never); a
    point without them keeps its run id, campaign identity and recipe."""
    plain = {"stages": [{"size": "20m", "points": [{"lr": 5.6e-3}], "seeds": [1]}]}
    section = json.loads(json.dumps(plain))
    section["stages"][0]["points"] += [
        {"lr": 5.6e-3, "name": "muon", "muon_lr": 2.8e-3},
        {"lr": 1e-3, "name": "adamw"},
    ]
    config = campaign.parse_campaign(section, CLUSTER_SIZES, "results/campaign")
    before = campaign.parse_campaign(plain, CLUSTER_SIZES, "results/campaign")
    ids = [r.run_id for r in campaign.planned_runs(config)["stage1"]]
    assert ids == ["20m-lr0.0056-s1", "20m-lr0.0056-muon-mlr0.0028-s1", "20m-lr0.001-s1"]
    assert campaign.settings_dict(before)["stages"] == [
        {"size": "20m", "points": [{"lr": 5.6e-3}], "seeds": [1]}
    ]
    again = campaign.config_from_settings(json.loads(json.dumps(campaign.settings_dict(config))))
    assert again == config
    template = campaign.load_templates(config)["20m"]
    recipes = campaign.stage1_recipes(config, template)
    assert recipes["20m-lr0.0056-s1"] == campaign.stage1_recipes(before, template)["20m-lr0.0056-s1"]
    muon = recipes["20m-lr0.0056-muon-mlr0.0028-s1"]["optimizer"]
    assert (muon["name"], muon["lr"], muon["muon"]["lr"], muon["beta2"]) == ("muon", 5.6e-3, 2.8e-3, 0.98)
    assert muon["muon"]["momentum"] == 0.95  # the rest of the section: its defaults
    for bad, message in [
        ([{"lr": 1e-3}, {"lr": 1e-3, "name": "adamw"}], "run ids repeat"),
        ([{"name": "sgd"}], "expected one of adamw, muon"),
        ([{"name": "muon", "muon_lr": 0.0}], "muon_lr: must be > 0 or null, got 0"),
    ]:
        broken = json.loads(json.dumps(section))
        broken["stages"][0]["points"] = bad
        with pytest.raises(ConfigError, match=message):
            campaign.parse_campaign(broken, CLUSTER_SIZES, "results/campaign")
    adamw_only = campaign.parse_campaign(
        {"stages": [{"size": "20m", "points": [{"muon_lr": 1e-3}]}]}, CLUSTER_SIZES, "results/campaign"
    )
    with pytest.raises(ConfigError, match="optimizer.muon: applies only under optimizer.name muon"):
        campaign.stage1_recipes(adamw_only, template)


def test_an_adamw_muon_tie_goes_to_adamw_then_the_lower_muon_lr():
    recipe = {"optimizer": {"lr": 1e-3, "weight_decay": 0.1, "beta2": 0.95}}
    result = {"final_validation": {"loss": 3.25}}
    muon = {"optimizer": {**recipe["optimizer"], "name": "muon"}}
    outcomes = [
        outcome_from("m-high", result, {"optimizer": {**muon["optimizer"], "muon": {"lr": 2e-3}}}),
        outcome_from("m-default", result, muon),  # muon.lr null (or no section) = lr
        outcome_from("z-adamw", result, recipe),
    ]
    ranked = campaign.rank_configurations(outcomes)
    assert [c.configuration for c in ranked] == ["z-adamw", "m-default", "m-high"]
    rows = campaign.ranking_rows(ranked)
    assert "name" not in rows[0] and "muon_lr" not in rows[0]  # an AdamW row is as before
    assert (rows[1]["name"], rows[1]["muon_lr"], rows[2]["muon_lr"]) == ("muon", 1e-3, 2e-3)


def test_the_optimizer_study_estimates_12_runs(capsys):
    """config/optimizers-20m.yaml: AdamW at lr 0.0056 and Muon at three muon_lr, 3 seeds each (its dry run:
    tests/workflow/test_workflow_static.py)."""
    study = Path(__file__).resolve().parents[2] / "config" / "optimizers-20m.yaml"
    assert run_cli("campaign", "estimate", "--workflow-config", str(study)) == 0
    captured = capsys.readouterr()
    estimate = json.loads(captured.out)
    [stage] = estimate["stages"]
    assert (stage["configurations"], stage["seeds"], stage["runs"]) == (4, 3, 12)
    assert estimate["total_gpu_hours"] == pytest.approx(12 * 408_071_168 / 1_636_281 / 3600)
    assert "stage1: 12 (4 configurations x 3 seeds) x 20m x 408,071,168 tokens -> 0.831 GPU-h" in captured.err


@pytest.mark.parametrize(
    ("name", "runs", "gpu_hours"),
    [("packed8-awc", 240, 29.720), ("packed4-awc", 135, 16.718), ("packed4-atc", 72, 8.916)],
)
def test_the_packed_sweeps_estimate_their_runs_and_gpu_hours(capsys, name, runs, gpu_hours):
    """config/sweep-packed*.yaml, as plan_campaign's message states them (the dry runs of one of them:
    tests/workflow/test_workflow_static.py)."""
    sweep = Path(__file__).resolve().parents[2] / "config" / f"sweep-{name}.yaml"
    assert run_cli("campaign", "estimate", "--workflow-config", str(sweep)) == 0
    captured = capsys.readouterr()
    [stage] = json.loads(captured.out)["stages"]
    assert (stage["configurations"], stage["seeds"], stage["runs"]) == (runs // 3, 3, runs)
    assert f"stage1: {runs} ({runs // 3} configurations x 3 seeds)" in captured.err
    assert f"-> {gpu_hours:.3f} GPU-h" in captured.err


def test_the_reference_72_run_sweep_is_a_workflow_config(capsys):
    """config/sweep-20m.yaml: 8 LR x 3 beta2 x seeds 42/43/44 of 20M at 131,072 tokens, micro 128."""
    sweep = Path(__file__).resolve().parents[2] / "config" / "sweep-20m.yaml"
    assert run_cli("campaign", "estimate", "--workflow-config", str(sweep)) == 0
    captured = capsys.readouterr()
    estimate = json.loads(captured.out)
    [stage] = estimate["stages"]
    assert (stage["configurations"], stage["seeds"], stage["runs"]) == (24, 3, 72)
    assert stage["tokens_per_run"] == 408_071_168
    assert estimate["total_gpu_hours"] == pytest.approx(72 * 408_071_168 / 1_636_281 / 3600)
    assert "stage1: 72 (24 configurations x 3 seeds) x 20m" in captured.err
    from tiny_llm.commands.campaign import workflow_campaign_settings

    config = campaign.config_from_settings(workflow_campaign_settings(str(sweep)))
    runs = campaign.planned_runs(config)["stage1"]
    assert runs[0].run_id == "20m-lr0.0014-wd0.1-beta2-0.95-s42"
    assert runs[-1].run_id == "20m-lr0.0224-wd0.1-beta2-0.999-s44"
    recipe = campaign.stage1_recipes(config, campaign.load_templates(config)["20m"])[
        "20m-lr0.0056-wd0.1-beta2-0.98-s43"
    ]
    assert recipe["training"]["batch_tokens"] == 131072 and recipe["training"]["micro_batch_size"] == 128
    assert recipe["runtime"]["seed"] == 43 and recipe["optimizer"]["beta1"] == 0.9


def test_plan_refuses_a_size_name_outside_the_campaign_root(tmp_path, capsys):
    settings = campaign.settings_dict(tiny_config(tmp_path))
    evil = "../../../X"
    settings["sizes"] = {evil: settings["sizes"]["s"], **settings["sizes"]}
    settings["stages"][0]["size"] = evil
    assert run_cli("campaign", "plan", "--settings", json.dumps(settings)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sizes.../../../X: '../../../X' is not a valid name" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing written anywhere


def test_the_schema_names_sizes_with_the_library_pattern():
    from tiny_llm.campaign.stages import NAME_PATTERN
    from tiny_llm.pipeline import load_schema

    schema = load_schema(str(Path(__file__).parents[2] / "schemas" / "workflow_config.schema.yaml"))
    assert schema["$defs"]["name"]["pattern"] == NAME_PATTERN


# ----------------------------------------------------------------------------- noise floor and the cut


def test_ranking_rows_say_how_sure_the_ranking_and_its_cut_are():
    ranked = campaign.rank_configurations(
        seeds_of("a", [3.00, 3.01, 3.02])
        + seeds_of("b", [3.05, 3.06, 3.04], lr=2e-3)
        + seeds_of("c", [3.051, 3.07, 3.045], lr=3e-3)
        + seeds_of("d", [3.50, 3.52, 3.51], lr=4e-3)
    )
    rows = campaign.ranking_rows(ranked, promoted=2)
    assert [r["promoted"] for r in rows] == [True, True, False, False]
    assert rows[0]["versus_best"] is None and rows[3]["versus_best"]["verdict"] == "worse"
    assert rows[1]["cut"]["side"] == "last promoted" and rows[2]["cut"]["side"] == "first left behind"
    assert rows[1]["cut"]["inside_noise"] and rows[1]["cut"]["verdict"] == "within noise"
    assert "cut" not in rows[0] and "cut" not in rows[3]
    floor = rows[0]["noise_floor"]
    assert floor["dof"] == 8 and floor["seeds"] == 3 and floor["detectable_difference"] > floor["pooled_sd"]
    assert rows[0]["loss_se"] == pytest.approx(0.01 / math.sqrt(3))
    assert all(r["bpb"] is None for r in rows)  # results without bits per byte (earlier runs)
    assert campaign.ranking_rows(ranked)[1]["promoted"] is None  # the stage's cut unknown: not marked
    assert "cut" not in campaign.ranking_rows(ranked)[1]


def test_ranking_rows_carry_bits_per_byte_over_the_seeds():
    result = {"final_validation": {"loss": 3.0, "bpb": 1.2}}
    recipe = {"optimizer": {"lr": 1e-3, "weight_decay": 0.1, "beta2": 0.95}}
    runs = [
        outcome_from(f"a-s{i}", {**result, "final_validation": {"loss": 3.0, "bpb": b}}, recipe, "a", i)
        for i, b in enumerate([1.2, 1.4])
    ]
    row = campaign.ranking_rows(campaign.rank_configurations(runs))[0]
    assert row["bpb"] == pytest.approx(1.3) and row["bpb_sd"] == pytest.approx(math.sqrt(0.02))
    assert row["run_bpb"] == [1.2, 1.4]


def tie_config(tmp_path: Path, rounds: int = 2) -> campaign.CampaignConfig:
    config = tiny_config(tmp_path)
    section = {
        "stages": [
            {"size": "s", "lr": [1e-3, 2e-3, 3e-3, 4e-3], "seeds": [1, 2]},
            {"size": "m", "parents": 2},
        ],
        "promotion": {"resolve_ties": {"extra_seeds": 2, "max_rounds": rounds}},
    }
    sizes = {k: dict(v) for k, v in config.sizes.items() if k in ("s", "m")}
    return campaign.parse_campaign(section, sizes, str(tmp_path / "ties"))


def test_a_cut_inside_the_noise_gets_extra_seeds_until_it_holds(tmp_path, capsys):
    config = tie_config(tmp_path)
    settings = settings_arg(config)
    assert run_cli("campaign", "plan", "--settings", settings) == 0
    # lr 0.002 and 0.003 straddle the cut, 0.001 is clearly better than both, 0.004 clearly worse
    losses = {"s-lr0.001-wd0.1-s1": 3.00, "s-lr0.001-wd0.1-s2": 3.01}
    losses |= {"s-lr0.002-wd0.1-s1": 3.20, "s-lr0.002-wd0.1-s2": 3.24}
    losses |= {"s-lr0.003-wd0.1-s1": 3.26, "s-lr0.003-wd0.1-s2": 3.28}
    losses |= {"s-lr0.004-wd0.1-s1": 4.00, "s-lr0.004-wd0.1-s2": 4.02}
    fake_results(config, "stage1", losses)
    assert campaign.tie_rounds(config, 0) == [1, 2]
    assert campaign.tie_rounds(config, 1) == [1, 2]  # the last stage's selection of its best, too
    assert campaign.tie_rounds(tiny_config(tmp_path), 0) == []  # no rule, no rounds
    capsys.readouterr()
    assert run_cli("campaign", "resolve", "--settings", settings, "--stage", "1", "--round", "1") == 0
    assert "seeds [3, 4] for s-lr0.002-wd0.1, s-lr0.003-wd0.1" in capsys.readouterr().out
    decision = json.loads(Path(campaign.tie_round_path(config, "stage1", 1)).read_text())
    assert decision["cut"]["inside_noise"] and decision["contested"] == ["s-lr0.002-wd0.1", "s-lr0.003-wd0.1"]
    extra = [e["run"] for e in decision["runs"]]
    assert extra == [
        "s-lr0.002-wd0.1-tie1-s3",
        "s-lr0.002-wd0.1-tie1-s4",
        "s-lr0.003-wd0.1-tie1-s3",
        "s-lr0.003-wd0.1-tie1-s4",
    ]
    add_seed = ("campaign", "add-seed", "--settings", settings, "--stage", "1", "--run")
    assert all(run_cli(*add_seed, run) == 0 for run in extra)
    recipe = yaml.safe_load(Path(campaign.recipe_path(config, "stage1", extra[1])).read_text())
    source = yaml.safe_load(Path(campaign.recipe_path(config, "stage1", "s-lr0.002-wd0.1-s1")).read_text())
    assert recipe["runtime"]["seed"] == 4 and recipe["runtime"]["output_dir"].endswith(extra[1])
    assert {k: v for k, v in recipe.items() if k != "runtime"} == {
        k: v for k, v in source.items() if k != "runtime"
    }
    assert run_cli(*add_seed, "s-lr0.002-wd0.1-tie2-s5") == 2
    assert "no extra seed that a decided tie-resolving round of stage1 added" in capsys.readouterr().err
    # the extra seeds tell the two apart: round 2 finds the cut holds (and ranks with every seed)
    fake_results(config, "stage1", dict(zip(extra, [3.21, 3.23, 3.27, 3.27], strict=True)))
    assert run_cli("campaign", "resolve", "--settings", settings, "--stage", "1", "--round", "2") == 0
    assert "the cut holds" in capsys.readouterr().out
    assert campaign.tie_decisions(config, 0)[-1]["runs"] == []
    assert run_cli("campaign", "select", "--settings", settings, "--stage", "2") == 0
    ranking = json.loads((Path(config.root) / "stage1" / "ranking.json").read_text())
    assert [r["n"] for r in ranking] == [2, 4, 4, 2] and ranking[1]["configuration"] == "s-lr0.002-wd0.1"
    assert ranking[1]["cut"]["inside_noise"] is False and ranking[1]["seeds"] == [1, 2, 3, 4]
    assert run_cli("campaign", "resolve", "--settings", settings, "--stage", "1", "--round", "3") == 2
    assert "no tie-resolving round 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            {"extra_seeds": 0},
            "campaign.promotion.resolve_ties.extra_seeds: must be >= 1, got 0",
        ),
        ({"extra_seeds": 2, "max_rounds": 0}, "resolve_ties.max_rounds: must be >= 1, got 0"),
        ({"extra_seed": 2}, "campaign.promotion.resolve_ties.extra_seed"),
    ],
)
def test_a_bad_tie_rule_is_refused_in_one_line(rule, message):
    section = {**CLUSTER_SECTION, "promotion": {"resolve_ties": rule}}
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")) as error:
        campaign.parse_campaign(section, CLUSTER_SIZES, "root")
    assert "\n" not in str(error.value)


def test_without_the_tie_rule_settings_and_identity_keep_their_form():
    assert "promotion" not in campaign.settings_dict(cluster())
    section = {**CLUSTER_SECTION, "promotion": {"resolve_ties": {"extra_seeds": 2}}}
    with_rule = campaign.parse_campaign(section, CLUSTER_SIZES, "root")
    assert campaign.settings_dict(with_rule)["promotion"] == {
        "resolve_ties": {"extra_seeds": 2, "max_rounds": 1}
    }
    assert campaign.config_from_settings(campaign.settings_dict(with_rule)) == with_rule


def test_the_schema_bounds_a_grid_as_the_optimizer_bounds_its_fields() -> None:
    """A grid value's range is stated once, beside the optimizer's field; the stage sections take it from
    there, and the workflow schema (which validates first) says the same."""
    from dataclasses import fields

    from tiny_llm.campaign.stages import GRID_KEYS, GridPoint, StageSection
    from tiny_llm.config import MuonConfig, OptimizerConfig
    from tiny_llm.pipeline.schema import load_schema
    from tiny_llm.typed import BOUNDS, bounds

    schema = load_schema(Path(__file__).resolve().parents[2] / "schemas" / "workflow_config.schema.yaml")
    stage = schema["properties"]["campaign"]["properties"]["stages"]["items"]["properties"]
    point = stage["points"]["items"]["properties"]
    optimizer = {f.name: bounds(f) for f in fields(OptimizerConfig)}
    optimizer["muon_lr"] = bounds(next(f for f in fields(MuonConfig) if f.name == "lr"))
    assert optimizer["muon_lr"] == {"exclusiveMinimum": 0}
    for key in GRID_KEYS:
        assert bounds(next(f for f in fields(StageSection) if f.name == key)) == optimizer[key], key
        assert {k: v for k, v in stage[key]["items"].items() if k in BOUNDS} == optimizer[key], key
    for f in fields(GridPoint):
        if f.name in optimizer:
            assert bounds(f) == optimizer[f.name], f.name
            assert {k: v for k, v in point[f.name].items() if k in BOUNDS} == optimizer[f.name], f.name


def test_the_optimizer_names_are_one_list() -> None:
    """A grid point names the optimizers the recipe knows, and the workflow schema the same ones."""
    import typing
    from dataclasses import fields

    from tiny_llm.campaign.stages import GridPoint
    from tiny_llm.config import OPTIMIZER_NAMES, OptimizerConfig
    from tiny_llm.pipeline.schema import load_schema

    hints = {cls: typing.get_type_hints(cls) for cls in (GridPoint, OptimizerConfig)}
    point = [a for a in typing.get_args(hints[GridPoint]["name"]) if a is not type(None)]
    assert typing.get_args(point[0]) == typing.get_args(hints[OptimizerConfig]["name"]) == OPTIMIZER_NAMES
    schema = load_schema(Path(__file__).resolve().parents[2] / "schemas" / "workflow_config.schema.yaml")
    stage = schema["properties"]["campaign"]["properties"]["stages"]["items"]["properties"]
    assert tuple(stage["points"]["items"]["properties"]["name"]["enum"]) == OPTIMIZER_NAMES
    assert {f.name for f in fields(GridPoint)} >= {"name", "muon_lr"}
