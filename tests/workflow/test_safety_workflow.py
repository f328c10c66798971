"""What the workflow must never do to a user's files: delete a directory named as the token cache, retrain
nothing after a recipe edit, or let a path reach the shell unquoted."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_helpers import snakemake, snakemake_command, snakemake_env, tiny_config, write_config

PREPARE = "results/data/prepare.yaml"

pytestmark = pytest.mark.slow


def test_a_foreign_cache_dir_is_refused_and_kept(tmp_path: Path) -> None:
    config = tiny_config()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "data.csv").write_text("precious")
    config["data"]["cache_dir"] = str(foreign)
    configfile = write_config(tmp_path / "tiny.yaml", config)
    proc = snakemake(tmp_path, configfile, "--cores", "1", "data")
    assert proc.returncode != 0  # not taken for a finished cache
    assert (foreign / "data.csv").read_text() == "precious"
    proc = snakemake(tmp_path, configfile, "--cores", "1", "--forcerun", "prepare_cache", "data")
    assert proc.returncode != 0  # a rerun of the cache's job deletes nothing either
    assert sorted(p.name for p in foreign.iterdir()) == ["data.csv"]
    log = (tmp_path / "logs/prepare_cache/cache.log").read_text()
    assert f"data.cache_dir {foreign} exists but is not a token cache" in log


def test_an_edited_run_retrains_in_one_call_and_only_that_run(tmp_path: Path) -> None:
    runs = {"tiny-a": {"size": "tiny"}, "tiny-b": {"size": "tiny"}}
    configfile = write_config(tmp_path / "tiny.yaml", tiny_config(**runs))
    assert snakemake(tmp_path, configfile, "--cores", "1", "runs").returncode == 0
    run_a, run_b = tmp_path / "results/runs/tiny-a", tmp_path / "results/runs/tiny-b"
    old_a = json.loads((run_a / "result.json").read_text())
    old_b = (run_b / "result.json").read_bytes()

    runs["tiny-a"]["overrides"] = {"optimizer": {"lr": 0.002}}
    write_config(configfile, tiny_config(**runs))
    proc = snakemake(tmp_path, configfile, "--cores", "1", "runs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    new_a = json.loads((run_a / "result.json").read_text())
    assert new_a["recipe_identity"] != old_a["recipe_identity"]
    assert yaml.safe_load((run_a / "resolved.yaml").read_text())["optimizer"]["lr"] == 0.002
    assert (run_b / "result.json").read_bytes() == old_b  # tiny-b's recipe did not change
    # the old run is set aside (all but result.json, a declared output that Snakemake deletes before a rerun)
    aside = tmp_path / "results/runs/tiny-a.replaced-1"
    assert json.loads((aside / "environment.json").read_text())["recipe_identity"] == old_a["recipe_identity"]
    assert json.loads((aside / "status.json").read_text())["status"] == "complete"
    assert (aside / "final.pt").is_file() and (aside / "metrics.jsonl").is_file()
    assert not (run_a / "latest.pt").exists() or "resumed" not in (run_a / "run.log").read_text()
    report = json.loads((tmp_path / "results/report/runs/comparison.json").read_text())
    assert "tiny-a.replaced-1" not in json.dumps(report)
    again = snakemake(tmp_path, configfile, "--cores", "1", "-n", "runs")
    assert "Nothing to be done" in again.stdout + again.stderr


# Snakemake's command line in a controller that writes recipe files as before runtime.cuda_graph existed.
BEFORE_CUDA_GRAPH = """
import runpy, sys
import tiny_llm.config as config
now = config.recipe_to_dict
def earlier(recipe):
    data = now(recipe)
    del data["runtime"]["cuda_graph"]
    return data
config.recipe_to_dict = earlier
sys.argv = ["snakemake", *sys.argv[1:]]
runpy.run_module("snakemake", run_name="__main__")
"""


def test_a_tree_from_before_a_new_recipe_key_is_refinalised_not_retrained(tmp_path: Path) -> None:
    """docs/architecture.md, "Results of earlier versions": the recipe files of a tree made before a key
    existed (runtime.cuda_graph, at its default: the recipe identity is the same) are written again and the
    jobs after them run; the finished run is recognised by its identity and only re-finalised from its final
    state: no update is trained again, nothing is set aside."""
    configfile = write_config(tmp_path / "tiny.yaml", tiny_config())
    args = snakemake_command(tmp_path, configfile, "--cores", "2", "runs")[3:]
    earlier = [sys.executable, "-c", BEFORE_CUDA_GRAPH, *args]
    proc = subprocess.run(
        earlier, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=snakemake_env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "results/runs/tiny-a"
    assert "cuda_graph" not in (run_dir / "recipe.yaml").read_text()
    assert "cuda_graph" not in (tmp_path / PREPARE).read_text()
    old = json.loads((run_dir / "result.json").read_text())
    log, trained = (run_dir / "run.log").read_text(), train_rows(run_dir)
    again = snakemake(tmp_path, configfile, "--cores", "2", "runs", timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "cuda_graph" in (run_dir / "recipe.yaml").read_text()  # plan files are written again
    new = json.loads((run_dir / "result.json").read_text())
    assert new["recipe_identity"] == old["recipe_identity"]
    assert new["final_validation"]["loss"] == old["final_validation"]["loss"]  # validated again, same weights
    session = (run_dir / "run.log").read_text()[len(log) :].splitlines()  # the rerun's lines
    assert any(line.endswith(f"final.pt at step {old['step']}/{old['step']}") for line in session), session
    assert not [line for line in session if re.search(r"epoch \d+/\d+ step", line)], session
    assert train_rows(run_dir) == trained
    assert not list(run_dir.parent.glob("tiny-a.replaced-*"))
    again = snakemake(tmp_path, configfile, "--cores", "2", "-n", "runs")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


def train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("event") == "train"]


HOSTILE = "my data 'q\" $(touch PWNED)"


def tiny_c4_corpus(path: Path) -> Path:
    from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir

    train, validation = split_documents(demo_documents(200_000), 0.1)
    write_c4_dir(path, train, validation)
    return path


def tool_commands(output: str) -> list[list[str]]:
    """Every `python -m tiny_llm` command Snakemake printed, split as the shell splits it."""
    lines = (line.strip().removeprefix("Shell command: ") for line in output.splitlines())
    return [shlex.split(line) for line in lines if line.startswith("python -m tiny_llm")]


def test_paths_with_spaces_quotes_and_substitutions_reach_the_shell_quoted(tmp_path: Path) -> None:
    from test_campaign_workflow import campaign_config

    corpus = tiny_c4_corpus(tmp_path / f"corpus {HOSTILE}")
    config = campaign_config()
    config["data"]["corpus"] = str(corpus)
    config["campaign"]["output_dir"] = f"results/campaign {HOSTILE}"
    configfile = write_config(tmp_path / "hostile.yaml", config)
    dry = snakemake(tmp_path, configfile, "-n", "-p", "campaign")
    assert dry.returncode == 0, dry.stderr[-2000:]
    commands = tool_commands(dry.stdout)
    assert {command[3] for command in commands} >= {"train-tokenizer", "campaign", "train", "report"}
    words = [word for command in commands for word in command]
    assert str(corpus) in words  # one argument each, exactly as configured
    assert any(word.startswith(f"results/campaign {HOSTILE}/") for word in words)
    assert not [word for word in words if "PWNED" in word and HOSTILE not in word]  # never split apart

    real = snakemake(tmp_path, configfile, "--cores", "1", "results/data/tokenizer")  # one real job
    assert real.returncode == 0, real.stderr[-2000:]
    assert (tmp_path / "results/data/tokenizer/tokenizer.json").is_file()
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()
