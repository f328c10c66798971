"""campaign.promotion.resolve_ties end to end on the CPU: a tiny two-stage campaign whose promotion cut falls
between two configurations that differ by a hair, so no seed count tells them apart. Each round adds a seed to
both (a checkpoint), both rounds run, the ranking counts every seed and marks the cut, stage 2 trains the
promoted configuration, and a rerun finds nothing to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from workflow_helpers import snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow

TWINS = ("t-s-lr0.03-wd0.1", "t-s-lr0.030003-wd0.1")
"""The best two configurations; their lr differs by 1e-4 of itself: all but the same run, seed by seed."""


def ties_config() -> dict:
    config = tiny_config()
    config["runs"] = {}
    config["data"]["prepare_validation_tokens"] = 8192
    size = {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}
    budget = {"tokens_per_parameter": 0.125, "epoch_tokens_per_parameter": 0.0625}
    config["sizes"] = {
        "t-s": {**size, "overrides": {"training": budget}},
        "t-m": {**size, "overrides": {"training": budget}},
    }
    config["campaign"] = {
        "stages": [
            {"size": "t-s", "lr": [3e-2, 3.0003e-2, 1e-4], "weight_decay": [0.1], "seeds": [1, 2]},
            {"size": "t-m", "parents": 1},
        ],
        "overrides": {"evaluation": {"subset_blocks": 8}, "runtime": {"deterministic": True}},
        "promotion": {"resolve_ties": {"extra_seeds": 1, "max_rounds": 2}},
    }
    return config


def ok(proc) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def test_a_cut_inside_the_noise_gets_seeds_round_by_round_and_a_rerun_does_nothing(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", ties_config())
    ok(snakemake(tmp_path, config, "--cores", "2", "campaign", timeout=900))
    root = tmp_path / "results/campaign"
    rounds = [json.loads((root / f"stage1/ties/round-{r}.json").read_text()) for r in (1, 2)]
    assert all(set(TWINS) <= set(r["contested"]) for r in rounds)
    assert [sorted({e["seed"] for e in r["runs"]}) for r in rounds] == [[3], [4]]
    ranking = json.loads((root / "stage1/ranking.json").read_text())
    twins = [row for row in ranking if row["configuration"] in TWINS]
    assert [row["seeds"] for row in twins] == [[1, 2, 3, 4]] * 2
    assert all((root / "stage1" / run / "result.json").is_file() for row in twins for run in row["runs"])
    cut = next(row["cut"] for row in ranking if "cut" in row)
    assert cut["inside_noise"] and {cut["last_promoted"], cut["first_left_behind"]} == set(TWINS)
    child = yaml.safe_load((root / "stage2/t-m-parent0-s1/resolved.yaml").read_text())
    assert child["optimizer"]["lr"] == ranking[0]["lr"] and child["runtime"]["seed"] == 1
    extra = yaml.safe_load((root / f"stage1/{TWINS[0]}-tie2-s4/resolved.yaml").read_text())
    assert extra["runtime"]["seed"] == 4 and extra["optimizer"]["lr"] == 3e-2
    # the report counts the extra seeds as seeds of their configurations
    rows = json.loads((root / "report/comparison.json").read_text())
    configurations = {r["configuration"]: r for r in rows if r["kind"] == "configuration"}
    assert all(configurations[c]["n"] == 4 for c in TWINS)
    assert "**inside the noise**" in (root / "report/report.md").read_text()
    assert "Nothing to be done" in ok(snakemake(tmp_path, config, "-n", "campaign"))
