"""The horizon study's plan: a trunk and a branch per horizon and seed, stop and keep points, needs."""

from __future__ import annotations

from types import SimpleNamespace

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
    assert h.horizons == [0.1, 0.2] and list(h.studies) == ["horizons"]  # one size: results/horizons/seed<S>/
    assert h.studies["horizons"].stable == {0.1: 13, 0.2: 26}
    assert h.trunk_flags("horizons") == "--stop-at-step 26 --keep-state-at 13"
    assert h.branch_state("horizons", 43, "h0.1") == "results/horizons/seed43/trunk/step-0000013.pt"
    assert h.trunk_done("horizons", 42) == "results/horizons/seed42/trunk/stopped.json"
    assert plan.targets("horizons")[:4] == [
        f"results/horizons/seed{s}/h{x}/result.json" for s in (42, 43) for x in (0.1, 0.2)
    ]
    trunk = yaml.safe_load(yaml.safe_dump(plan.files.content("results/horizons/seed43/trunk/recipe.yaml")))
    assert trunk["training"]["tokens_per_parameter"] == 0.2 and trunk["runtime"]["seed"] == 43
    assert trunk["runtime"]["output_dir"] == "results/horizons/seed43/trunk"
    assert plan.targets("horizons") == plan.default_targets("horizons")
    assert (
        plan.stages["horizons"] is h and h.resources(SimpleNamespace(horizon_study="horizons")).threads == 1
    )
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


SIZES = {
    "tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10},
    "wide": {"preset": "tiny", "overrides": {"model": {"width": 96}}, "threads": 2, "mem_mb": 1000},
}


def test_several_sizes_get_a_study_each_under_a_size_level_and_a_variant_its_own_root() -> None:
    study = {
        **{k: v for k, v in STUDY.items() if k != "size"},
        "sizes": ["tiny", "wide"],
        "size_overrides": {"wide": {"optimizer": {"lr": 0.001}}},
        "variants": {"muon": {"overrides": {"optimizer": {"name": "muon"}}}},
    }
    plan = plan_of(tiny(sizes=SIZES, horizons=study))
    h = plan.horizons
    assert list(h.studies) == ["horizons/tiny", "horizons/wide", "horizons-muon/tiny", "horizons-muon/wide"]
    # each size its own decay starts (another parameter count, another budget) and its own trunk flags
    assert h.studies["horizons/tiny"].stable == {0.1: 13, 0.2: 26}
    wide = h.studies["horizons/wide"].stable
    assert (
        wide[0.2] > 26
        and h.trunk_flags("horizons/wide") == f"--stop-at-step {wide[0.2]} --keep-state-at {wide[0.1]}"
    )
    assert (
        h.branch_state("horizons/wide", 42, "h0.2")
        == f"results/horizons/wide/seed42/trunk/step-{wide[0.2]:07d}.pt"
    )
    assert h.results()[:2] == [
        "results/horizons/tiny/seed42/h0.1/result.json",
        "results/horizons/tiny/seed42/h0.2/result.json",
    ]
    assert h.results("muon")[0] == "results/horizons-muon/tiny/seed42/h0.1/result.json"
    assert set(h.results()) | set(h.results("muon")) <= set(plan.targets("horizons"))
    recipe = plan.files.content("results/horizons/wide/seed43/h0.1/recipe.yaml")
    assert recipe["model"]["width"] == 96 and recipe["optimizer"]["lr"] == 0.001  # the size's own overrides
    assert recipe["runtime"]["output_dir"] == "results/horizons/wide/seed43/h0.1"
    assert plan.files.content("results/horizons/tiny/seed43/h0.1/recipe.yaml")["optimizer"]["lr"] == 0.003
    muon = plan.files.content("results/horizons-muon/wide/seed42/trunk/recipe.yaml")["optimizer"]
    assert muon["name"] == "muon" and muon["lr"] == 0.001
    assert h.resources(SimpleNamespace(horizon_study="horizons-muon/wide")).threads == 2


def test_one_size_keeps_its_layout_and_recipes() -> None:
    """`size` and a one-entry `sizes` plan the same recipes; only `sizes` adds the size level."""
    one = plan_of(tiny(horizons=STUDY))
    listed = plan_of(tiny(horizons={**{k: v for k, v in STUDY.items() if k != "size"}, "sizes": ["tiny"]}))
    for seed in (42, 43):
        for name in ("trunk", "h0.1", "h0.2"):
            a = one.files.content(f"results/horizons/seed{seed}/{name}/recipe.yaml")
            b = listed.files.content(f"results/horizons/tiny/seed{seed}/{name}/recipe.yaml")
            assert {**a, "runtime": {}} == {**b, "runtime": {}}
            assert {k: v for k, v in a["runtime"].items() if k != "output_dir"} == {
                k: v for k, v in b["runtime"].items() if k != "output_dir"
            }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sizes": ["tiny"]}, "give size .one study. or sizes .a grid., not both"),
        ({"size": None, "sizes": ["tiny", "tiny"]}, "horizons.sizes: each size once"),
        ({"size": None, "sizes": ["nope"]}, "unknown size 'nope'"),
        ({"size_overrides": {"wide": {}}}, "horizons.size_overrides.wide: not a size of the study"),
    ],
)
def test_sizes_are_checked_in_one_line(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        plan_of(tiny(sizes=SIZES, horizons={**STUDY, **change}))
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


def test_the_report_of_several_sizes_has_a_row_per_size_and_horizon(tmp_path) -> None:
    from tiny_llm.io import atomic_write_json, atomic_write_yaml
    from tiny_llm.report.horizons import write_horizons_report

    runs = []
    for parameters, horizon, loss in [(2000, 0.1, 4.0), (1000, 0.1, 4.5), (1000, 0.2, 4.2)]:
        run = tmp_path / f"p{parameters}-h{horizon}"
        atomic_write_yaml(
            run / "resolved.yaml", {"training": {"tokens_per_parameter": horizon}, "runtime": {"seed": 42}}
        )
        atomic_write_json(run / "result.json", {"parameters": parameters, "final_validation": {"loss": loss}})
        runs.append(run)
    rows = write_horizons_report(runs, tmp_path / "out")
    assert [(r["parameters"], r["tokens_per_parameter"]) for r in rows] == [
        (1000, 0.1),
        (1000, 0.2),
        (2000, 0.1),
    ]
    table = (tmp_path / "out" / "report.md").read_text()
    assert table.splitlines()[0].startswith("| Parameters | Tokens/param |")
    assert "| 2,000 | 0.1 | 4.000000 | - | - | - | 1 |" in table
