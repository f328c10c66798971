"""Files one job writes for another (tiny_llm.recorded): each carries its writer's digest, and the job that
reads it refuses an edited one in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.files import PlanFiles, check_plan_files
from tiny_llm.recorded import recorded_problem, without_record, write_recorded_json, write_recorded_yaml

RECIPE = {"optimizer": {"lr": 0.003, "weight_decay": 0.1}, "model": {"num_layers": 2}}


def test_a_recorded_yaml_passes_as_written_and_keeps_its_comment(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    write_recorded_yaml(path, RECIPE, "campaign plan", comment="# for people\n")
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# written by tiny-llm campaign plan; content digest ")
    assert lines[1] == "# for people" and recorded_problem(path) is None


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda text: text.replace("lr: 0.003", "lr: 0.03"), "is not what `campaign select` wrote"),
        (lambda text: text.split("\n", 1)[1], "carries no record of the job that wrote it"),
        (lambda text: text + "extra: 1\n", "is not what `campaign select` wrote"),
    ],
    ids=["value", "record-removed", "key-added"],
)
def test_an_edited_yaml_is_named(tmp_path: Path, edit, problem: str) -> None:
    path = tmp_path / "recipe.yaml"
    write_recorded_yaml(path, RECIPE, "campaign select")
    path.write_text(edit(path.read_text()))
    assert problem in (recorded_problem(path) or "")


def test_a_recorded_json_round_trips_and_an_edit_is_named(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_recorded_json(path, {"profile": "cpu", "slots": [1, 2]}, "tune plan")
    assert recorded_problem(path) is None
    assert without_record(json.loads(path.read_text())) == {"profile": "cpu", "slots": [1, 2]}
    path.write_text(path.read_text().replace('"cpu"', '"gpu"'))
    assert recorded_problem(path) == "is not what `tune plan` wrote (edited since?)"


def test_a_job_refuses_an_edited_recorded_input_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    write_recorded_yaml(path, RECIPE, "campaign plan")
    files = PlanFiles()
    files.add_recorded([str(path)])
    expected = files.expected([str(path), str(tmp_path / "other.yaml")])
    assert json.loads(expected) == {str(path): "recorded"}
    check_plan_files(expected)  # as written
    path.write_text(path.read_text().replace("num_layers: 2", "num_layers: 3"))
    with pytest.raises(ConfigError) as refused:
        check_plan_files(expected)
    assert str(refused.value) == (
        f"{path} is not what `campaign plan` wrote (edited since?); delete it and rerun the same snakemake "
        "command: the workflow writes it again"
    )


def test_a_pattern_marks_the_files_a_checkpoint_adds_and_a_hyphenated_writer_is_read(tmp_path: Path) -> None:
    files = PlanFiles()
    files.add_recorded([], pattern=r"results/campaign/stage[0-9]+/[^/]+/recipe\.yaml")
    added = "results/campaign/stage1/t-s-lr0.003-wd0.1-tie1-s3/recipe.yaml"
    assert json.loads(files.expected([added, "results/campaign/settings.json"])) == {added: "recorded"}
    path = tmp_path / "recipe.yaml"
    write_recorded_yaml(path, RECIPE, "campaign add-seed")
    assert recorded_problem(path) is None
