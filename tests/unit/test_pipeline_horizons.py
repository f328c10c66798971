"""The horizon study's plan: a trunk and a branch per horizon and seed, stop and keep points, needs."""

from __future__ import annotations

import pytest
import yaml
from pipeline_helpers import plan_of, shipped, tiny

from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.layout import PREPARE_RECIPE

STUDY = {
    "size": "tiny",
    "horizons": [0.2, 0.1],
    "seeds": [42, 43],
    "overrides": {
        "optimizer": {"lr_schedule": "wsd", "warmup_fraction": 0, "warmup_steps": 3},
        "training": {"epoch_tokens_per_parameter": 0.04},
        "data": {"shuffle_group_size": 1},
    },
}


def test_trunk_stops_at_the_longest_decay_start_and_keeps_each_shorter_one() -> None:
    plan = plan_of(tiny(horizons=STUDY))
    h = plan.horizons
    assert h.horizons == [0.1, 0.2] and h.stable == {0.1: 13, 0.2: 26}
    assert h.trunk_flags() == "--stop-at-step 26 --keep-state-at 13"
    assert h.branch_state(43, "h0.1") == "results/horizons/seed43/trunk/step-0000013.pt"
    assert h.trunk_done(42) == "results/horizons/seed42/trunk/stopped.json"
    assert plan.targets("horizons")[:4] == [
        f"results/horizons/seed{s}/h{x}/result.json" for s in (42, 43) for x in (0.1, 0.2)
    ]
    trunk = yaml.safe_load(yaml.safe_dump(plan.files.content("results/horizons/seed43/trunk/recipe.yaml")))
    assert trunk["training"]["tokens_per_parameter"] == 0.2 and trunk["runtime"]["seed"] == 43
    assert trunk["runtime"]["output_dir"] == "results/horizons/seed43/trunk"
    assert plan.targets("horizons") == plan.default_targets("horizons")
    assert plan.stages["horizons"] is h and h.resources(None).threads == 1
    # the cache holds every block of the loader-v2 groups of the longest horizon (tiny: one 65,536-token shard
    # per group), and one token of the next shard
    assert max(h.cache_tokens_needed()) == 65_536 + 1
    assert plan.files.content(PREPARE_RECIPE)["data"]["prepare_train_tokens"] >= 65_536 + 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"data": {"shuffle_group_size": None}},
            "horizons: branches continue a shared trunk, which needs loader v2",
        ),
        ({"optimizer": {"warmup_steps": None, "warmup_fraction": 0.05}}, "optimizer.warmup_steps"),
    ],
)
def test_the_study_says_in_one_line_what_it_needs(change: dict, message: str) -> None:
    study = {**STUDY, "overrides": {k: {**v, **change.get(k, {})} for k, v in STUDY["overrides"].items()}}
    with pytest.raises(ConfigError, match=message) as info:
        plan_of(tiny(horizons=study))
    assert "\n" not in str(info.value)


def test_the_demo_study_is_in_the_default_target_and_off_without_horizons() -> None:
    demo = plan_of(shipped("workflow_config.yaml"))
    assert "results/report/horizons/loss-vs-horizon.png" in demo.default_targets("horizons")
    assert plan_of(tiny()).targets("horizons") == []


def test_report_gives_mean_sd_se_and_bits_per_byte_over_seeds_per_horizon(tmp_path) -> None:
    from tiny_llm.io import atomic_write_json, atomic_write_yaml
    from tiny_llm.report.horizons import write_horizons_report

    runs = []
    for horizon, seed, loss in [(0.2, 42, 3.0), (0.1, 42, 4.0), (0.2, 43, 3.2), (0.1, 43, 4.4)]:
        run = tmp_path / f"s{seed}-h{horizon}"
        atomic_write_yaml(
            run / "resolved.yaml", {"training": {"tokens_per_parameter": horizon}, "runtime": {"seed": seed}}
        )
        atomic_write_json(run / "result.json", {"final_validation": {"loss": loss, "bpb": loss / 4}})
        runs.append(run)
    rows = write_horizons_report(runs, tmp_path / "out")
    assert [r["tokens_per_parameter"] for r in rows] == [0.1, 0.2]
    assert rows[0]["losses"] == {"42": 4.0, "43": 4.4} and rows[0]["mean_loss"] == pytest.approx(4.2)
    assert rows[1]["sd_loss"] == pytest.approx(0.1414213, rel=1e-6)
    assert (tmp_path / "out" / "loss-vs-horizon.png").stat().st_size > 1000
    assert rows[0]["se_loss"] == pytest.approx(0.2) and rows[0]["bpb"] == {"42": 1.0, "43": 1.1}
    assert rows[0]["mean_bpb"] == pytest.approx(1.05) and rows[0]["sd_bpb"] == pytest.approx(
        0.0707107, rel=1e-6
    )
    assert (
        "| 0.1 | 4.200000 | 0.282843 | 0.200000 | 1.0500 | 2 |"
        in (tmp_path / "out" / "report.md").read_text()
    )
