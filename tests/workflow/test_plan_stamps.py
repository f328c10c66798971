"""The planned content decides what is rewritten and retrained, under every rerun trigger and without
Snakemake's records: a tree copied without .snakemake/, or run with `--rerun-triggers mtime`, retrains exactly
the run whose recipe the config changed, and has nothing to do when the config did not change."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from workflow_helpers import snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow

RUNS = {"tiny-a": {"size": "tiny"}, "tiny-b": {"size": "tiny"}}


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def jobs(dry_run: str, rule: str) -> list[str]:
    """The `--run` wildcard of every job of ``rule`` a dry run (``--quiet host``) lists."""
    found, current = [], None
    for line in dry_run.splitlines():
        if line.startswith("rule ") or line.startswith("localrule "):
            current = line.split()[1].rstrip(":")
        elif current == rule and line.strip().startswith("wildcards: run="):
            found.append(line.split("run=", 1)[1].strip())
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished plain runs."""
    workdir = tmp_path_factory.mktemp("finished")
    configfile = write_config(workdir / "tiny.yaml", tiny_config(**RUNS))
    ok(snakemake(workdir, configfile, "--cores", "2", "runs"))
    return workdir


@pytest.mark.parametrize("how", ["without-records", "mtime-trigger"])
def test_a_changed_recipe_reruns_its_run_alone_under_every_trigger(
    finished: Path, tmp_path: Path, how: str
) -> None:
    workdir = shutil.copytree(finished, tmp_path / "copy", symlinks=True)
    triggers = ["--rerun-triggers", "mtime"] if how == "mtime-trigger" else []
    if how == "without-records":
        shutil.rmtree(workdir / ".snakemake")  # deleted to clear a lock, or results/ synced elsewhere
    configfile = workdir / "tiny.yaml"
    unchanged = ok(snakemake(workdir, configfile, "--cores", "2", "-n", "runs", *triggers))
    assert "Nothing to be done" in unchanged

    runs = {**RUNS, "tiny-a": {"size": "tiny", "overrides": {"optimizer": {"lr": 0.002}}}}
    write_config(configfile, tiny_config(**runs))
    planned = ok(snakemake(workdir, configfile, "--cores", "2", "-n", "runs", *triggers))
    assert jobs(planned, "train_run") == ["tiny-a"]
    assert "results/runs/tiny-a/recipe.yaml" in planned and "results/runs/tiny-b/recipe.yaml" not in planned

    ok(snakemake(workdir, configfile, "--cores", "2", "runs", *triggers))
    assert "lr: 0.002" in (workdir / "results/runs/tiny-a/resolved.yaml").read_text()
    assert "Nothing to be done" in ok(snakemake(workdir, configfile, "--cores", "2", "-n", "runs", *triggers))

    write_config(configfile, tiny_config(**RUNS))  # back to the first lr: written and trained again
    back = ok(snakemake(workdir, configfile, "--cores", "2", "-n", "runs", *triggers))
    assert jobs(back, "train_run") == ["tiny-a"]
