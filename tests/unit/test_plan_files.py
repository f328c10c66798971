"""A plan file edited by hand is refused by the job that reads it (tiny_llm.pipeline.files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_llm.cli import main
from tiny_llm.pipeline.files import PLAN_FILES_ENV, PlanFiles, write_plan_file, write_stamp

RECIPE = {"model": {"num_layers": 2, "dim": 64}, "optimizer": {"lr": 1e-05, "betas": (0.9, 0.95)}}


def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """RECIPE written as the workflow writes it, and a job's environment naming it with its digest."""
    monkeypatch.chdir(tmp_path)
    path = "results/runs/a/recipe.yaml"
    files = PlanFiles()
    files.add(path, RECIPE, stage="runs")
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


def test_a_stamp_names_the_content_and_maps_back_to_its_file() -> None:
    files = PlanFiles()
    files.add("results/runs/a/recipe.yaml", RECIPE, stage="runs")
    files.add("results/campaign/settings.json", {"stages": []}, stage="campaign")
    stamp = files.stamp("results/runs/a/recipe.yaml")
    assert stamp.startswith("results/.plan/") and files.stamped(stamp) == "results/runs/a/recipe.yaml"
    assert files.stamps(["runs"]) == [stamp] and len(files.stamps(["runs", "campaign"])) == 2
    changed = PlanFiles()
    changed.add("results/runs/a/recipe.yaml", {**RECIPE, "optimizer": {"lr": 2e-05}}, stage="runs")
    other = changed.stamp("results/runs/a/recipe.yaml")
    assert other != stamp and other.split("-")[0] == stamp.split("-")[0]  # same file, other content


def test_a_new_stamp_removes_the_old_ones_of_its_file(tmp_path: Path) -> None:
    old, other_file = tmp_path / "aaaa-1111", tmp_path / "bbbb-1111"
    old.touch()
    other_file.touch()
    write_stamp(tmp_path / "aaaa-2222")
    # back at the first content, the file is written again: its old stamp must not stand in for the new one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aaaa-2222", "bbbb-1111"]
