"""The workflow plan (tiny_llm.pipeline): config -> recipes, files, resources, targets; no Snakemake."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pipeline_helpers import REPO, SCHEMA, flatten, plan_of, set_value, shipped, tiny

from tiny_llm.campaign import CampaignChangedError
from tiny_llm.config import deep_merge, load_recipe, recipe_from_dict
from tiny_llm.errors import ConfigError
from tiny_llm.pipeline import build_plan, write_plan_file
from tiny_llm.pipeline.layout import PREPARE_RECIPE
from tiny_llm.tuning.candidates import base_recipe, profile_from_dict


@pytest.mark.parametrize("name", ["workflow_config.yaml", "config/cluster.yaml"])
def test_schema_defaults_equal_snakemakes(name: str) -> None:
    from snakemake.utils import validate

    ours, theirs = shipped(name), shipped(name)
    plan_of(ours)  # validates a copy; fill the original the same way
    from tiny_llm.pipeline.schema import validate_config

    validate_config(ours, SCHEMA, name)
    validate(theirs, str(REPO / "schemas/workflow_config.schema.yaml"))
    assert ours == theirs


def test_every_schema_problem_is_one_line_naming_the_key() -> None:
    config = tiny()
    config["runz"] = config.pop("runs")
    config["sizes"]["tiny"]["threads"] = "four"
    with pytest.raises(ConfigError) as err:
        plan_of(config)
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid workflow config (test.yaml):"
    assert "  (top level): unknown key 'runz' (did you mean 'runs'?)" in lines
    assert "  sizes.tiny.threads: 'four' is not of type 'integer'" in lines


def test_run_recipe_file_is_the_cli_merge_of_preset_and_overrides() -> None:
    """recipe.yaml equals `--config PRESET --set ...` of every recipe_defaults, size, run and data key."""
    config = shipped("workflow_config.yaml")
    plan = plan_of(config)
    filled = plan.config
    overrides = filled["runs"]["demo-s-wsd"]["overrides"]
    assert overrides["optimizer"]["lr_schedule"] == "wsd"
    merged = deep_merge(copy.deepcopy(filled["recipe_defaults"]), overrides)
    sets = [f"{key}={set_value(value)}" for key, value in flatten(merged)]
    data = plan.book.data_overrides()
    sets += [f"{key}={set_value(value)}" for key, value in flatten(data)]
    sets.append("runtime.output_dir=results/runs/demo-s-wsd")
    expected = load_recipe(["demo-s"], sets)
    written = plan.files.content("results/runs/demo-s-wsd/recipe.yaml")
    assert recipe_from_dict(written) == expected
    assert (
        written["data"]["dataset"] == "results/data/corpus"
        and written["data"]["tokenizer"] == "results/data/tokenizer"
    )


def test_recipe_files_round_trip_through_yaml(tmp_path: Path) -> None:
    plan = plan_of(shipped("config/cluster.yaml"))
    path = tmp_path / "recipe.yaml"
    content = plan.files.content("results/packed/packed4-20m-awc/recipe.yaml")
    write_plan_file(path, content)
    assert load_recipe([str(path)]) == recipe_from_dict(content)
    assert yaml.safe_load(path.read_text()) == content


def test_cache_recipe_covers_the_largest_budget_of_any_job() -> None:
    plan = plan_of(shipped("config/cluster.yaml"))
    cache = plan.files.content(PREPARE_RECIPE)
    assert cache["data"]["dataset"] == "allenai/c4"
    assert cache["data"]["dataset_revision"] == "1588ec454efa1a09f29cd18ddd04fe05fc8653a2"
    needs = [need for stage in plan.stages.values() for need in stage.cache_tokens_needed()]
    assert cache["data"]["prepare_train_tokens"] == max(needs)
    # the 90m campaign runs need the most: more than the 20m plain run
    from tiny_llm.budget import make_budget

    assert (
        cache["data"]["prepare_train_tokens"]
        > make_budget(plan.runs.recipes["20m-reference"]).cache_tokens_needed
    )


def test_digest_changes_with_content_only() -> None:
    first, again = plan_of(tiny()), plan_of(tiny())
    path = "results/runs/a/recipe.yaml"
    assert first.files.digest(path) == again.files.digest(path)
    changed = plan_of(tiny(runs={"a": {"size": "tiny", "overrides": {"optimizer": {"lr": 0.002}}}}))
    assert changed.files.digest(path) != first.files.digest(path)
    assert first.files.digest_of([path, "results/data/cache"]) == first.files.digest(path)


def test_plan_files_pattern_matches_exactly_the_plan_files() -> None:
    import re

    plan = plan_of(shipped("workflow_config.yaml"))
    pattern = re.compile(f"^(?:{plan.files.pattern()})$")
    for path in ("results/runs/demo-s/recipe.yaml", "results/campaign/settings.json", PREPARE_RECIPE):
        assert pattern.match(path), path
    for path in (
        "results/runs/demo-s/result.json",
        "results/campaign/stage1/x/recipe.yaml",
        "results/runsXdemo",
    ):
        assert not pattern.match(path), path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"runs": {"r": {"size": "huge"}}}, "runs.r.size: unknown size 'huge'; sizes: tiny"),
        (
            {"runs": {"r": {"size": "tiny", "overrides": {"optimizer": {"lrr": 0.1}}}}},
            "runs.r: invalid recipe: optimizer.lrr: unknown key (did you mean 'lr'?)",
        ),
        (
            {"campaign": {"stages": [{"size": "huge", "lr": [0.001]}]}},
            "campaign.stages[0].size: unknown size 'huge'; sizes: tiny",
        ),
        (
            {"tuning": {"profiles": {"p": {"size": "huge"}}}},
            "tuning.profiles.p.size: unknown size 'huge'; sizes: tiny",
        ),
        (
            {"packed": {"runs": {"p": {"size": "huge", "preset": "packed4-tiny"}}}},
            "packed.runs.p.size: unknown size 'huge'; sizes: tiny",
        ),
        (
            {"packed": {"runs": {"p": {"size": "tiny", "preset": "tiny"}}}},
            "packed.runs.p.preset: 'tiny' is not a packed recipe (no decentralized section)",
        ),
        (
            {"tuning": {"default_profiles": ["gh200"]}},
            "tuning.default_profiles: tuning profile 'gh200' is not defined here (profiles: none)",
        ),
        (
            {
                "packed": {
                    "benchmark": {"size": "tiny", "preset": "packed4-tiny", "global_batch_tokens": 1000}
                }
            },
            "packed.benchmark.global_batch_tokens: 1000 is not num_models x micro x context",
        ),
    ],
)
def test_bad_stage_settings_name_the_key(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_of(tiny(**extra))
    assert message in str(err.value)


def test_resources_come_from_the_size_or_the_section() -> None:
    plan = plan_of(shipped("config/cluster.yaml"))
    run = plan.job_resources("runs", SimpleNamespace(run="20m-reference"))
    assert (run.threads, run.mem_mb, run.runtime_minutes, run.gpu) == (8, 64000, 60, 1)
    campaign = plan.job_resources("campaign", SimpleNamespace(run="90m-parent0"))
    assert (campaign.runtime_minutes, campaign.gpu) == (180, 1)
    tuning = plan.job_resources("tuning", SimpleNamespace(profile="gh200"))
    assert tuning.runtime_minutes == 600 // 60 + 10
    functions = plan.resources("runs")
    assert functions["runtime"](SimpleNamespace(run="20m-reference"), 2) == 120
    assert plan.threads("packed")(SimpleNamespace(execution="packed")) == 8  # the benchmark's
    demo = plan_of(shipped("workflow_config.yaml"))
    assert demo.job_resources("runs", SimpleNamespace(run="demo-s")).gpu == 0  # device cpu in the demo sizes


def test_targets_per_stage_and_disabled_stages_leave_the_default_target() -> None:
    config = shipped("workflow_config.yaml")
    plan = plan_of(config)
    assert plan.targets("data") == ["results/data/cache/manifest.json"]
    assert "results/report/runs/learning-curves.png" in plan.targets("runs")
    assert plan.targets("tuning") == ["results/cpu-tuning/selected.yaml"]
    assert "results/campaign/stage3/ranking.json" in plan.targets("campaign")
    assert plan.targets("packed")[-1] == "results/packed-benchmarks/summary.json"
    config["campaign"]["enabled"] = False
    config["packed"]["default_target"] = False
    quiet = plan_of(config)
    assert quiet.default_targets("campaign") == [] and quiet.targets("campaign") == plan.targets("campaign")
    assert quiet.default_targets("packed") == [] and quiet.default_targets("runs") == plan.targets("runs")


def test_campaign_runs_threads_and_stages() -> None:
    plan = plan_of(shipped("config/cluster.yaml"))
    campaign = plan.campaign
    assert campaign is not None and campaign.stage_names == ["stage1", "stage2", "stage3"]
    assert campaign.previous("stage3") == "stage2" and campaign.stage_number("stage2") == 2
    assert campaign.recipes("stage2")[0] == "results/campaign/stage2/50m-parent0-beta2-0.95/recipe.yaml"
    assert campaign.thread_flags("20m-lr0.001-wd0.1", 8) == ""  # tuned: keeps the tuning's threads
    settings = plan.files.content("results/campaign/settings.json")
    assert settings["tuning"]["20m"] == "results/gh200-tuning/selected.yaml"
    with pytest.raises(ConfigError, match="not a run of the campaign"):
        campaign.size("nope")
    demo = plan_of(shipped("workflow_config.yaml")).campaign
    assert demo is not None and demo.thread_flags("demo-l-parent0-s42", 1) == "--set runtime.cpu_threads=1"


def test_tuning_profile_file_and_slots() -> None:
    plan = plan_of(shipped("config/cluster.yaml"))
    profile = plan.files.content("results/gh200-tuning/profile.yaml")
    assert profile["configs"] == ["20m"] and "sets" not in profile
    assert profile["overrides"]["data"]["dataset"] == "allenai/c4"  # one nested mapping of recipe keys
    assert "batch_tokens" not in profile["overrides"]["training"]
    assert "s1-m128-compile" in plan.tuning.slot_names("gh200")  # the reference's 20m production setting
    inputs = plan.tuning.candidate_inputs("gh200", "s1-m8-compile")
    assert inputs["plan"] == "results/gh200-tuning/plan.json"
    assert inputs["cache"] == "results/data/c4-tinyllama/manifest.json"
    assert len(inputs["earlier"]) == plan.tuning.slot_names("gh200").index("s1-m8-compile")
    with pytest.raises(ConfigError, match="tuning profile 'nope' is not defined"):
        plan.tuning.candidates("nope")


@pytest.mark.parametrize("name", ["config/cluster.yaml", "workflow_config.yaml"])
def test_every_size_is_tuned_at_the_batch_its_campaign_trains_with(name: str) -> None:
    config = shipped(name)
    campaign = config["campaign"]
    if name == "workflow_config.yaml":  # the demo comment offers the cpu tuning for demo-s, at its batch
        campaign["tuning"] = {"demo-s": "cpu"}
        del campaign["batch_tokens"]["demo-s"]
    plan = plan_of(config)
    for profile in config["tuning"]["profiles"]:  # gh200 and h200 tune 20m, as the campaign runs it
        spec = plan.files.content(f"results/{profile}-tuning/profile.yaml")
        size = config["tuning"]["profiles"][profile]["size"]
        tuned = base_recipe(profile_from_dict(profile, spec)).training.batch_tokens
        campaign_batch = campaign.get("batch_tokens", {}).get(size)
        if campaign_batch is None:
            campaign_batch = plan.book.size_recipe(size).training.batch_tokens
        assert tuned == campaign_batch, profile
    assert plan.campaign is not None and set(plan.campaign.tuned_sizes) == set(campaign["tuning"])


def campaign_tuned_at(batch_tokens: int | None, profile: str = "p") -> dict:
    overrides = {} if batch_tokens is None else {"training": {"batch_tokens": batch_tokens}}
    return tiny(
        campaign={"stages": [{"size": "tiny", "lr": [0.001]}], "tuning": {"tiny": profile}},
        tuning={"profiles": {"p": {"size": "tiny", "overrides": overrides, "space": "cpu"}}},
    )


def test_a_tuning_profile_at_another_batch_is_refused_when_the_workflow_is_parsed() -> None:
    plan_of(campaign_tuned_at(None))  # the size's own batch (1,024): fine
    plan_of(campaign_tuned_at(1024))
    with pytest.raises(ConfigError) as err:
        plan_of(campaign_tuned_at(512))
    message = str(err.value)
    assert len(message.splitlines()) == 1
    # the very check (and message) of `campaign plan` on a tuning result
    assert message.startswith(
        "campaign.tuning.tiny: tuning profile 'p' was measured at training.batch_tokens=512"
    )
    assert "size 'tiny' trains at 1024" in message
    config = campaign_tuned_at(512)
    config["campaign"]["batch_tokens"] = {"tiny": 512}  # the campaign's own batch decides
    plan_of(config)
    with pytest.raises(ConfigError, match="campaign.tuning.tiny: tuning profile 'nope' is not defined"):
        plan_of(campaign_tuned_at(None, profile="nope"))


def test_a_tuning_profile_of_another_model_is_refused_when_the_workflow_is_parsed() -> None:
    config = campaign_tuned_at(None)
    config["sizes"]["big"] = {**config["sizes"]["tiny"], "overrides": {"model": {"num_layers": 3}}}
    config["tuning"]["profiles"]["p"]["size"] = "big"
    with pytest.raises(
        ConfigError, match=r"campaign.tuning.tiny: tuning profile 'p' tuned another model shape"
    ):
        plan_of(config)


def test_campaign_estimate_reads_the_workflow_config(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiny_llm",
            "campaign",
            "estimate",
            "--workflow-config",
            "config/cluster.yaml",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    estimate = json.loads(proc.stdout)
    assert [s["runs"] for s in estimate["stages"]] == [6, 4, 2]
    assert estimate["stages"][0]["tokens_per_second"] == 1636281


def test_pipeline_imports_neither_torch_nor_snakemake() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['snakemake'] = None\n"
        "import yaml\n"
        "from tiny_llm.pipeline import build_plan, load_schema\n"
        "schema = load_schema('schemas/workflow_config.schema.yaml')\n"
        "build_plan(yaml.safe_load(open('config/cluster.yaml')), schema, precheck_campaign=False)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_evaluate_run_dir_is_the_final_state_with_the_runs_recipe(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args, capsys: pytest.CaptureFixture
) -> None:
    """The evaluate_run rule's `evaluate --run DIR` = `--config DIR/resolved.yaml --checkpoint DIR/final.pt`:
    the rule need not know what a run directory holds."""
    from train_helpers import small_recipe

    from tiny_llm.cli import main
    from tiny_llm.engines import run_training
    from tiny_llm.io import read_json
    from tiny_llm.train.rows import TIMING_FIELDS

    run_dir = tmp_path / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "training.tokens_per_parameter=0.1")
    assert run_training(recipe, quiet=True) == 0
    by_run, by_files = tmp_path / "by-run.json", tmp_path / "by-files.json"
    assert main(["evaluate", "--run", str(run_dir), "--output", str(by_run)]) == 0
    files = ["--config", str(run_dir / "resolved.yaml"), "--checkpoint", str(run_dir / "final.pt")]
    assert main(["evaluate", *files, "--output", str(by_files)]) == 0
    results = [{k: v for k, v in read_json(p).items() if k not in TIMING_FIELDS} for p in (by_run, by_files)]
    assert results[0] == results[1] and results[0]["split"] == "subset"
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run_dir), *files]) == 2
    assert "give exactly one of --checkpoint (with --config) or --run DIR" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(tmp_path)]) == 2
    assert "is not a run directory (no resolved.yaml)" in capsys.readouterr().err


# Builds the Snakefile's plan (the campaign precheck on) in the working directory and prints, as JSON, every
# path under results/ that was opened, listed or stat'ed, with whether the campaign's identity precheck
# (tiny_llm.campaign.steps.precheck) was on the stack. A subprocess: an audit hook cannot be removed.
AUDITED_PLAN = """
import json, os, sys
results = os.path.abspath("results") + os.sep
touched = []

def in_precheck():
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "precheck" and code.co_filename.endswith(os.path.join("campaign", "steps.py")):
            return True
        frame = frame.f_back
    return False

def note(kind, path):
    if isinstance(path, (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(path))
        if path.startswith(results) or path + os.sep == results:
            touched.append([kind, os.path.relpath(path), in_precheck()])

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args:
        note(event, args[0])

def watched(name, real):
    def call(path, *args, **kwargs):
        note(name, path)
        return real(path, *args, **kwargs)
    return call

sys.addaudithook(hook)
os.stat, os.lstat = watched("stat", os.stat), watched("lstat", os.lstat)
import yaml
from tiny_llm.pipeline import build_plan, load_schema
repo = sys.argv[1]
config = yaml.safe_load(open(os.path.join(repo, "workflow_config.yaml")))
schema = load_schema(os.path.join(repo, "schemas/workflow_config.schema.yaml"))
plan = build_plan(config, schema, "workflow_config.yaml", numerics_version=2)
print(json.dumps({"touched": touched, "files": len(plan.files._content)}))
"""


def test_building_the_plan_reads_nothing_under_results_but_the_campaign_precheck(
    tmp_path: Path, monkeypatch
) -> None:
    """docs/architecture.md, "Results of earlier versions": a plan file's content is what the workflow config
    says now, never what a file on disk says. With every plan file, tuning schedule and run result of the
    demo on disk, building the Snakefile's plan opens, lists or stats no path under results/, except in the
    one read allowed: the campaign's identity precheck (tiny_llm.campaign.steps.precheck, a changed campaign
    refused before any job starts)."""
    monkeypatch.chdir(tmp_path)
    plan = plan_of(shipped("workflow_config.yaml"))
    for path in plan.files._content:
        write_plan_file(path, plan.files.content(path))
    for name in plan.tuning.profiles:
        write_plan_file(plan.tuning.schedule_file(name, REPO / "config"), {"slots": []})
    for path in ("results/runs/demo-s/result.json", "results/campaign/stage1/campaign.json"):
        write_plan_file(path, {"recipe_identity": "earlier"})
    write_plan_file(Path(plan.campaign.root) / "identity.json", {"identity": "earlier"})
    proc = subprocess.run(
        [sys.executable, "-c", AUDITED_PLAN, str(REPO)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    audit = json.loads(proc.stdout)
    assert audit["files"] == len(plan.files._content)
    assert [entry for entry in audit["touched"] if not entry[2]] == []
    assert ["stat", "results/campaign/identity.json", True] in audit["touched"]  # the precheck did run


def test_a_campaign_directory_of_another_identity_is_refused_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """The campaign's identity precheck, when the Snakefile builds its plan: a campaign directory recording
    another campaign is refused before any job starts, in one line naming campaign.output_dir."""
    monkeypatch.chdir(tmp_path)
    config = shipped("workflow_config.yaml")
    write_plan_file("results/data/cache/manifest.json", {"identity": "cache", "validation_complete": True})
    build_plan(copy.deepcopy(config), SCHEMA, numerics_version=2)  # no campaign recorded yet
    write_plan_file(
        "results/campaign/identity.json", {"identity": "earlier", "payload": {"numerics_version": 1}}
    )
    with pytest.raises(CampaignChangedError) as err:
        build_plan(copy.deepcopy(config), SCHEMA, numerics_version=2)
    message = str(err.value)
    assert message.startswith(
        "campaign.output_dir: campaign settings changed; use a new output directory (results/campaign: "
    )
    assert "numerics_version: 1 -> 2" in message and "\n" not in message
    assert plan_of(config).campaign.root == "results/campaign"  # commands that only read a plan: no check
