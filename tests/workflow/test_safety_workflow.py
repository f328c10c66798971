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
from workflow_helpers import (
    repository_snakemake,
    snakemake,
    snakemake_command,
    snakemake_env,
    tiny_config,
    write_config,
)

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
    commands = [without_assignments(shlex.split(line)) for line in lines if "python -m tiny_llm" in line]
    return [words for words in commands if words[:3] == ["python", "-m", "tiny_llm"]]


def without_assignments(words: list[str]) -> list[str]:
    """A shell command's words after its leading VAR=value assignments (a job's TINY_LLM_PLAN_FILES)."""
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0], re.DOTALL):
        words = words[1:]
    return words


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


def test_a_templated_workflow_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    configfile = tmp_path / "tiny.yaml"
    text = yaml.safe_dump(tiny_config(), sort_keys=False)
    configfile.write_text("__use_yte__: true\n" + text, encoding="utf-8")
    proc = snakemake(tmp_path, configfile, "-n")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {configfile}: __use_yte__ (Snakemake's YAML templates, which run Python) is not allowed in "
        "a workflow config; remove the key and write the values out"
    ]
    assert not (tmp_path / "results").exists()


def console_of(command: list[str], cwd: Path, terminal: bool) -> tuple[int, str]:
    """A command's exit code and console (stdout and stderr together), on a terminal (a pty) or a pipe."""
    if not terminal:
        proc = subprocess.run(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
            env=snakemake_env(),
            stdin=subprocess.DEVNULL,
        )
        return proc.returncode, proc.stdout
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        command, cwd=cwd, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=snakemake_env()
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: every holder of the follower end closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_a_failed_job_names_its_log_and_error_with_the_shipped_profile(
    tmp_path: Path, terminal: bool
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.jsonl").write_text("not json\n")
    config = tiny_config()
    config["data"]["corpus"] = str(corpus)
    configfile = write_config(tmp_path / "tiny.yaml", config)
    command = repository_snakemake(tmp_path, "--cores", "1", "data", configfile=configfile)  # no --quiet
    returncode, console = console_of(command, tmp_path, terminal)
    assert returncode != 0
    log = "logs/train_tokenizer/tokenizer.log"
    error = (tmp_path / log).read_text().strip()
    assert error.startswith("error: ") and "\n" not in error
    assert "Error in rule" not in console  # the shipped profile's quiet: [rules] hides Snakemake's block
    assert f"Failed job log(s): {log}\n  {log}: {error}\nFix the cause, then rerun" in console
    assert "To go on, rerun the same command" not in console
    assert (corpus / "train.jsonl").read_text() == "not json\n"  # the corpus is left as it was


def test_a_plan_file_edited_by_hand_is_refused_by_its_job(tmp_path: Path) -> None:
    configfile = write_config(tmp_path / "tiny.yaml", tiny_config())
    assert snakemake(tmp_path, configfile, "--cores", "1", PREPARE).returncode == 0
    recipe = tmp_path / PREPARE
    edited = recipe.read_text().replace("shuffle_seed: ", "shuffle_seed: 1")
    assert edited != recipe.read_text()
    recipe.write_text(edited)
    proc = snakemake(tmp_path, configfile, "--cores", "1", "data")
    assert proc.returncode != 0
    log = (tmp_path / "logs/prepare_cache/cache.log").read_text()
    assert log == (
        f"error: {PREPARE} is not what the workflow config says (edited since the workflow wrote it?); "
        "delete it and rerun the same snakemake command: the workflow writes it again from the config\n"
    )
    assert recipe.read_text() == edited
