"""A plan file edited by hand is refused by the job that reads it (tiny_llm.pipeline.files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_llm.cli import main
from tiny_llm.pipeline.files import PLAN_FILES_ENV, PlanFiles, write_plan_file

RECIPE = {"model": {"num_layers": 2, "dim": 64}, "optimizer": {"lr": 1e-05, "betas": (0.9, 0.95)}}


def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """RECIPE written as the workflow writes it, and a job's environment naming it with its digest."""
    monkeypatch.chdir(tmp_path)
    path = "results/runs/a/recipe.yaml"
    files = PlanFiles()
    files.add(path, RECIPE)
    write_plan_file(path, RECIPE)
    monkeypatch.setenv(PLAN_FILES_ENV, files.expected([path, "results/data/cache/manifest.json"]))
    return tmp_path / path


def test_a_plan_file_as_written_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    planned(tmp_path, monkeypatch)
    assert main(["campaign", "plan"]) == 2  # got past the check to the command's own arguments
    assert "--settings" in capsys.readouterr().err


def test_an_edited_plan_file_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    recipe = planned(tmp_path, monkeypatch)
    edited = recipe.read_text().replace("num_layers: 2", "num_layers: 3")
    recipe.write_text(edited)
    assert main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: results/runs/a/recipe.yaml is not what the workflow config says (edited since the workflow "
        "wrote it?); delete it and rerun the same snakemake command: the workflow writes it again from the "
        "config\n"
    )
    assert recipe.read_text() == edited  # left for the user to look at
    assert sorted(p.name for p in recipe.parent.iterdir()) == ["recipe.yaml"]  # nothing trained
