"""What a user asks of the workflow plan: numbers as people write them, timed jobs alone on the machine, an
undefined tuning profile, and the closing lines of a run (where to look, which log failed)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from pipeline_helpers import REPO, SCHEMA, plan_of, shipped, tiny

from tiny_llm.errors import ConfigError
from tiny_llm.pipeline import build_plan


def test_numbers_as_people_write_them_are_numbers() -> None:
    config = tiny(
        runs={"a": {"size": "tiny", "overrides": {"optimizer": {"lr": "1e-3", "weight_decay": "1E-1"}}}}
    )
    config["campaign"] = {"stages": [{"size": "tiny", "lr": ["3e-4", "1E-3"], "weight_decay": ["0"]}]}
    config["campaign"]["throughput"] = {"tiny": "5e4"}
    plan = plan_of(config)
    recipe = plan.files.content("results/runs/a/recipe.yaml")
    assert recipe["optimizer"]["lr"] == 0.001 and recipe["optimizer"]["weight_decay"] == 0.1
    assert plan.config["campaign"]["stages"][0]["lr"] == [0.0003, 0.001]
    assert plan.config["campaign"]["throughput"]["tiny"] == 50000
    # a string field stays a string, even when it looks like a number
    config["data"] = {"corpus_revision": "1e5"}
    assert plan_of(config).config["data"]["corpus_revision"] == "1e5"


def test_timed_jobs_take_every_local_core() -> None:
    config = shipped("workflow_config.yaml")
    local = build_plan(
        copy.deepcopy(config), SCHEMA, numerics_version=1, precheck_campaign=False, local_cores=2
    )
    assert local.threads("tuning")(SimpleNamespace(profile="cpu")) == 2
    assert local.threads("packed")(SimpleNamespace(execution="packed")) == 2
    assert (
        local.threads("runs")(SimpleNamespace(run="demo-s")) == 1
    )  # training jobs keep their size's threads
    cluster = plan_of(config)  # local_cores None: a cluster job is its own allocation
    assert cluster.threads("tuning")(SimpleNamespace(profile="cpu")) == 1
    bench = local.files.content("results/packed-benchmarks/n4-eager/recipe.yaml")
    assert bench["runtime"]["cpu_threads"] == config["packed"]["benchmark"]["threads"]


def test_an_undefined_tuning_profile_names_the_config_that_defines_it() -> None:
    plan = plan_of(shipped("workflow_config.yaml"))
    with pytest.raises(ConfigError) as err:
        plan.tuning.schedule_file("gh200", REPO / "config")
    message = str(err.value)
    assert "\n" not in message
    assert "tuning profile 'gh200' is not in this workflow config (cpu)" in message
    assert "snakemake --configfile config/cluster.yaml results/gh200-tuning/selected.yaml" in message
    with pytest.raises(ConfigError, match="define it under tuning.profiles"):
        plan.tuning.schedule_file("nowhere", REPO / "config")
    assert plan.tuning.schedule_file("cpu", REPO / "config") == "results/cpu-tuning/plan.json"


def test_failed_job_logs_and_where_to_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiny_llm.pipeline.controller import failed_job_logs, where_to_look

    log = (
        "[Mon Nov 30]\nError in rule train_run:\n    jobid: 4\n    input: results/runs/a/recipe.yaml\n"
        "    log: logs/train_run/a.log (check log file(s) for error details)\n    conda-env: x\n"
        "Error in rule bench_packed:\n    log: logs/bench_packed/packed-n4-eager.log (check log file(s))\n"
    )
    assert failed_job_logs(log) == ["logs/train_run/a.log", "logs/bench_packed/packed-n4-eager.log"]
    monkeypatch.chdir(tmp_path)
    plan = plan_of(shipped("workflow_config.yaml"))
    assert where_to_look(plan) == []
    (tmp_path / "results/cpu-tuning").mkdir(parents=True)
    (tmp_path / "results/cpu-tuning/selected.yaml").write_text("{}")
    assert where_to_look(plan) == ["  tuning    results/cpu-tuning/selected.yaml"]
    summary = Path(plan.analysis.summary_files("demo-s")[0])
    horizons, throughput = "results/report/horizons/loss-vs-horizon.png", "results/throughput/throughput.md"
    for path in (summary, Path(horizons), Path(throughput)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    assert where_to_look(plan)[1:] == [
        f"  analysis  {summary}",
        f"  horizons  {horizons}",
        f"  throughput {throughput}",
    ]


def test_export_stage_plans_runs_and_the_best_of_each_campaign_size() -> None:
    plan = plan_of(shipped("workflow_config.yaml"))
    assert plan.export.directories()[:2] == ["results/exports/demo-s", "results/exports/demo-s-wsd"]
    assert plan.export.ranking("demo-l") == "results/campaign/stage3/ranking.json"
    prompts = plan.files.content("results/exports/prompts.yaml")
    assert prompts["prompts"] and prompts["temperature"] == 0.8
    config = shipped("workflow_config.yaml")
    config["export"] = {"campaign": False, "sampling": {"temperature": 0}, "default_target": False}
    quiet = plan_of(config)
    assert [path.split("/")[-1] for path in quiet.export.directories()] == list(config["runs"])
    assert quiet.default_targets("export") == [] and quiet.targets("export")
    assert plan.export.options() == "--dtype float32 --gguf" and quiet.export.options() == "--dtype float32"
    # one core: an export beside a training job, not alone on two cores of which it uses one
    assert plan.threads("export")(SimpleNamespace(run="demo-s")) == 1
    config["export"] = {"sampling": {"top_p": 2}}
    with pytest.raises(ConfigError, match=r"export.sampling.top_p: must be in \(0, 1\], got 2"):
        plan_of(config)


def test_analysis_stage_plans_one_job_per_checkpoint_and_case() -> None:
    from tiny_llm.analysis.names import cache_tokens_needed
    from tiny_llm.budget import make_budget

    config = shipped("workflow_config.yaml")
    config["analysis"] = {"runs": ["demo-s"], "noise_samples": 4, "random_samples": 4}
    plan = plan_of(config)
    recipe = plan.runs.recipes["demo-s"]
    epochs = make_budget(recipe).num_epochs
    assert recipe.training.checkpoint_policy == "all"  # an analysed run keeps every epoch's state
    assert plan.files.content("results/runs/demo-s/recipe.yaml")["training"]["checkpoint_policy"] == "all"
    jobs = plan.analysis.jobs("demo-s")
    assert len(jobs) == 2 * epochs
    assert jobs[:2] == [
        "results/analysis/demo-s/s4-r4-seed42/epoch-001-seen/result.json",
        "results/analysis/demo-s/s4-r4-seed42/epoch-001-unseen/result.json",
    ]
    assert plan.analysis.flags("unseen").startswith("--case unseen --noise-samples 4 --random-samples 4")
    cache = plan.files.content("results/data/prepare.yaml")["data"]["prepare_train_tokens"]
    assert cache >= cache_tokens_needed(recipe)  # the unseen epoch lies past the run's budget
    assert plan.targets("analysis")[0] == "results/analysis/demo-s/s4-r4-seed42/summary.csv"


@pytest.mark.parametrize(
    ("analysis", "message"),
    [
        ({"runs": ["nope"]}, "analysis.runs: nope is not in runs: demo-s, "),
        ({"runs": ["packed:nope"]}, "analysis.runs: packed:nope is not in packed"),
        ({"runs": ["campaign:stage9/x"]}, "analysis.runs: campaign:stage9/x is not a run of the campaign"),
        (
            {"runs": ["campaign:stage1/" + "demo-s-lr0.003-wd0-s42"], "checkpoints": ["epoch-001"]},
            "the run saves no epoch-001 (checkpoint_policy interval)",
        ),
    ],
)
def test_analysis_of_a_missing_run_or_checkpoint_is_refused_when_parsed(analysis: dict, message: str) -> None:
    config = shipped("workflow_config.yaml")
    config["analysis"] = analysis
    with pytest.raises(ConfigError) as err:
        plan_of(config)
    assert message in str(err.value)


def test_the_best_run_of_a_campaign_size_is_analysed_once_ranked() -> None:
    config = shipped("config/cluster.yaml")
    plan = plan_of(config)
    run = plan.analysis.runs["campaign-best-20m"]
    assert run.source == ["--best-of", "results/campaign/stage1/ranking.json"]
    assert run.ready == "results/campaign/stage1/ranking.json" and run.run_dir == ""
    assert plan.analysis.jobs("campaign-best-20m") == [
        "results/analysis/campaign-best-20m/s32-r32-seed42/final-seen/result.json",
        "results/analysis/campaign-best-20m/s32-r32-seed42/final-unseen/result.json",
    ]
    config["analysis"]["runs"] = ["campaign:best-7b"]
    with pytest.raises(ConfigError, match="campaign:best-7b: no campaign stage trains it"):
        plan_of(config)


def test_tracking_reaches_training_jobs_through_the_environment_only() -> None:
    config = shipped("workflow_config.yaml")
    plain = plan_of(config)
    assert plain.tracking_env == {}
    config["tracking"] = {"tensorboard": True, "wandb": {"project": "demo", "mode": "offline"}}
    tracked = plan_of(config)
    section = json.loads(tracked.tracking_env["TINY_LLM_TRACKING"])
    assert section["tensorboard"] is True and section["wandb"]["project"] == "demo"
    # Recipes, and so every job's input and identity, stay as they were.
    assert plain.files.digest_of(list(plain.files._content)) == tracked.files.digest_of(
        list(tracked.files._content)
    )
    config["tracking"] = {"wandb": {"mode": "sometimes"}}
    with pytest.raises(ConfigError, match="tracking.wandb.mode"):
        plan_of(config)


def test_closing_summary_names_the_best_run_per_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiny_llm.pipeline.controller import best_run_lines, where_to_look

    monkeypatch.chdir(tmp_path)
    plan = plan_of(shipped("workflow_config.yaml"))

    def result(run: str, loss: float | None) -> None:
        (tmp_path / "results/runs" / run).mkdir(parents=True)
        final = None if loss is None else {"loss": loss}
        (tmp_path / "results/runs" / run / "result.json").write_text(json.dumps({"final_validation": final}))

    result("demo-s", 4.5)
    result("demo-s-wsd", 4.25)
    result("demo-s-long", None)  # diverged: never the best
    ranking = tmp_path / "results/campaign/stage3/ranking.json"
    ranking.parent.mkdir(parents=True)
    rows = [
        {"rank": 1, "run": "demo-l-b", "runs": ["demo-l-b"], "run_losses": [3.9]},
        {
            "rank": 0,
            "run": "demo-l-a-s43",
            "runs": ["demo-l-a-s42", "demo-l-a-s43"],
            "run_losses": [3.8, 3.7],
        },
    ]
    ranking.write_text(json.dumps(rows))
    (tmp_path / "results/exports/best-demo-l").mkdir(parents=True)
    assert best_run_lines(plan) == [
        "  best demo-s: results/runs/demo-s-wsd loss 4.2500, export not exported (snakemake export)",
        "  best demo-l: results/campaign/stage3/demo-l-a-s43 loss 3.7000, export results/exports/best-demo-l",
    ]
    assert where_to_look(plan)[-2:] == best_run_lines(plan)
    (tmp_path / "results/campaign/stage1").mkdir(parents=True)
    (tmp_path / "results/campaign/stage1/ranking.json").write_text("{damaged")  # skipped, not fatal
    assert len(best_run_lines(plan)) == 2


def test_a_run_id_with_a_trailing_newline_is_refused() -> None:
    config = shipped("workflow_config.yaml")
    config["runs"]["demo-x\n"] = config["runs"]["demo-s"]
    with pytest.raises(ConfigError, match="runs"):
        plan_of(config)


def test_a_huge_grid_value_makes_a_run_id_the_rules_match() -> None:
    from tiny_llm.campaign.stages import format_value

    assert format_value(1e20) == "1e20" and format_value(1e-5) == "1e-05" and format_value(0.003) == "0.003"
    config = shipped("workflow_config.yaml")
    config["campaign"]["stages"][0]["lr"] = [1e20, 1e-3]
    plan = plan_of(config)
    run_ids = [run.run_id for runs in plan.campaign.runs.values() for run in runs]
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", run) for run in run_ids), run_ids


def test_export_names_that_collide_are_refused() -> None:
    config = shipped("workflow_config.yaml")
    config["runs"]["best-demo-l"] = config["runs"]["demo-s"]  # and the campaign's best demo-l
    with pytest.raises(ConfigError, match="results/exports/best-demo-l"):
        plan_of(config)


def test_analysis_names_that_collide_are_refused() -> None:
    config = shipped("workflow_config.yaml")
    config["runs"]["packed-packed4-demo"] = config["runs"]["demo-s"]
    config["export"] = {"runs": False}
    config["analysis"] = {"runs": ["packed-packed4-demo", "packed:packed4-demo"]}
    with pytest.raises(ConfigError, match="results/analysis/packed-packed4-demo"):
        plan_of(config)
