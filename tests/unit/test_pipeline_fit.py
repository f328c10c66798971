"""The scaling fit's plan: what it fits, the run it predicts, what the fit costs; one-line refusals."""

from __future__ import annotations

import json

import pytest
from pipeline_helpers import plan_of, shipped, tiny

from tiny_llm.errors import ConfigError
from tiny_llm.pipeline.fit import describe_estimate

SIZES = {
    "tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10},
    "wide": {"preset": "tiny", "overrides": {"model": {"width": 96}}, "threads": 1, "mem_mb": 1000},
    "wider": {"preset": "tiny", "overrides": {"model": {"width": 128}}, "threads": 2, "mem_mb": 1500},
}
STUDY = {
    "sizes": ["tiny", "wide", "wider"],
    "horizons": [0.1, 0.2],
    "seeds": [42],
    "overrides": {
        "optimizer": {"lr_schedule": "wsd", "warmup_fraction": 0, "warmup_steps": 3},
        "training": {"epoch_tokens_per_parameter": 0.04},
        "data": {"shuffle_group_size": 1},
    },
}


def fit_plan(fit: dict | None = None, **study: object):
    return plan_of(tiny(sizes=SIZES, horizons={**STUDY, **study}, fit=fit or {}))


def test_the_demo_fits_its_three_sizes_and_predicts_a_longer_run_before_training_it() -> None:
    plan = plan_of(shipped("workflow_config.yaml"))
    fit = plan.fit
    assert plan.default_targets("fit") == plan.targets("fit") == fit.requested_targets()
    assert (
        "results/fit/prediction.json" in fit.targets() and "results/fit/verify/result.json" in fit.targets()
    )
    assert len(fit.runs()) == 9 and fit.runs()[0] == "results/horizons/demo-s/seed42/h0.05/result.json"
    args = fit.law_args()
    assert args[:2] == ["--runs", "results/horizons/demo-s/seed42/h0.05"] and "--variant" not in args
    assert args[args.index("--bootstrap") + 1] == "200"
    recipe = plan.files.content("results/fit/verify/recipe.yaml")
    assert (
        recipe["training"]["tokens_per_parameter"] == 0.4
        and recipe["runtime"]["output_dir"] == "results/fit/verify"
    )
    branch = plan.files.content("results/horizons/demo-s/seed42/h0.2/recipe.yaml")
    same = {k: v for k, v in recipe.items() if k not in ("training", "runtime")}
    assert same == {k: v for k, v in branch.items() if k not in ("training", "runtime")}  # the study's recipe
    assert fit.report_inputs() == {
        "fit": "results/fit/fit.json",
        "prediction": "results/fit/prediction.json",
        "verify": "results/fit/verify/result.json",
    }


def test_variants_are_fitted_apart_and_the_verify_run_can_be_a_larger_size() -> None:
    variants = {"muon": {"overrides": {"optimizer": {"name": "muon"}}}}
    verify = {"size": "wider", "horizon": 0.4, "seed": 7}
    plan = plan_of(
        tiny(
            sizes={**SIZES, "widest": {"preset": "tiny", "overrides": {"model": {"width": 192}}}},
            horizons={**STUDY, "variants": variants},
            fit={"verify": {**verify, "size": "widest"}},
        )
    )
    args = plan.fit.law_args()
    muon = args[args.index("--variant") + 1 : args.index("--bootstrap")]
    assert len(muon) == 6 and all(a.startswith("muon:results/horizons-muon/") for a in muon)
    assert len(plan.fit.law_inputs()["variants"]) == 6 and len(plan.fit.runs()) == 6
    recipe = plan.files.content("results/fit/verify/recipe.yaml")
    assert recipe["model"]["width"] == 192 and recipe["runtime"]["seed"] == 7
    assert recipe["optimizer"]["name"] == "adamw"  # the study's recipe, not a variant's
    # the verify run's job: its size's resources; it is in the cache's budget
    assert plan.fit.resources(None).mem_mb == 16000 and plan.fit.cache_tokens_needed()


@pytest.mark.parametrize(
    ("study", "fit", "message"),
    [
        (
            {"sizes": ["tiny", "wide"]},
            {"default_target": True},
            "needs at least 3 sizes; the fitted runs have 2",
        ),
        ({}, {"verify": {"size": "wide", "horizon": 0.2}}, r"\(wide, 0.2 tokens per parameter\) is a point"),
        ({}, {"runs": ["nope"]}, "fit.runs: 'nope' is not in runs: a"),
        ({}, {"runs": ["campaign:stage1/x"]}, "fit.runs: campaign:stage1/x is not a run of the campaign"),
        (
            {"horizons": []},
            {"verify": {"size": "wide", "horizon": 1}},
            "fit.verify: the verify run is the horizon",
        ),
    ],
)
def test_what_the_fit_cannot_do_is_one_line(study: dict, fit: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        fit_plan(fit, **study)
    assert "\n" not in str(info.value)


def test_the_fit_target_alone_says_what_is_missing() -> None:
    """Off by default: a config without a grid plans nothing for it, and only `snakemake fit` is refused."""
    plan = plan_of(tiny())
    assert plan.default_targets("fit") == plan.targets("fit") == []
    with pytest.raises(ConfigError, match="fit: nothing to fit"):
        plan.fit.requested_targets()
    plan = fit_plan()
    assert "results/fit/fit.json" in plan.targets("fit") and plan.default_targets("fit") == []
    assert "results/fit/prediction.json" not in plan.targets("fit") and plan.fit.report_args() == []
    plan = plan_of(tiny(sizes=SIZES, horizons={**STUDY, "sizes": ["tiny"]}))
    with pytest.raises(ConfigError, match="at least 3 sizes"):
        plan.fit.requested_targets()


def test_a_study_costs_its_trunks_and_the_decays_of_its_branches() -> None:
    """Per size and seed: the trunk's updates up to the longest horizon's decay start, then each branch's
    rest; a size without tokens/s is priced unknown."""
    from tiny_llm.budget import make_budget

    plan = plan_of(tiny(sizes=SIZES, horizons={**STUDY, "seeds": [1, 2], "throughput": {"tiny": 100.0}}))
    rows = plan.fit.estimate()["rows"]
    study = plan.horizons.studies["horizons/tiny"]
    budget = {h: make_budget(study.recipes[1, h]) for h in (0.1, 0.2)}

    def until(h: float, step: int) -> int:  # tokens of the first `step` updates (epochs end in short ones)
        return 64 * sum(n for _, _, n in budget[h].update_schedule()[:step])

    assert (until(0.1, 13), until(0.2, 26), budget[0.1].tokens, budget[0.2].tokens) == (
        11584,
        23168,
        13248,
        26432,
    )
    assert rows[0]["tokens"] == 2 * (23168 + (13248 - 11584) + (26432 - 23168)) and rows[0]["seeds"] == 2
    assert rows[0]["independent_tokens"] == 2 * (13248 + 26432)
    assert rows[0]["gpu_hours"] == pytest.approx(rows[0]["tokens"] / 100 / 3600)
    assert rows[1]["gpu_hours"] is None and plan.fit.estimate()["total_gpu_hours"] is None


@pytest.mark.slow  # the 250m/500m budgets: ~1 s each to plan
def test_the_cluster_grid_and_its_muon_variant_are_priced() -> None:
    """config/scaling-c4.yaml: per size and seed a trunk to 36 tokens per parameter and four decays (43.5 in
    all, 1.72x fewer than 75 trained alone), at the configured tokens/s; the Muon config adds its grid."""
    estimate = plan_of(shipped("config/scaling-c4.yaml")).fit.estimate()
    rows = {row["what"]: row for row in estimate["rows"]}
    assert rows["horizons/20m"]["tokens"] == 1_775_110_144 and rows["horizons/20m"]["seeds"] == 2
    assert rows["horizons/250m"]["gpu_hours"] == pytest.approx(32.24, abs=0.01)
    assert rows["fit.verify"]["tokens"] == 10_336_281_600 and rows["fit.verify"]["size"] == "500m"
    assert estimate["total_gpu_hours"] == pytest.approx(68.9, abs=0.05)
    grid = [row for row in estimate["rows"] if row["what"] != "fit.verify"]
    assert sum(r["independent_tokens"] for r in grid) / sum(r["tokens"] for r in grid) == pytest.approx(
        1.72, abs=0.01
    )
    assert "total: 46,220,430,336 tokens" in describe_estimate(estimate)
    muon = plan_of(shipped("config/scaling-c4-muon.yaml")).fit.estimate()
    assert [r["what"] for r in muon["rows"]][4:8] == [
        f"horizons-muon/{s}" for s in ("20m", "50m", "90m", "250m")
    ]
    assert muon["total_gpu_hours"] == pytest.approx(110.8, abs=0.05)
    unknown = plan_of(tiny(sizes=SIZES, horizons=STUDY)).fit.estimate()
    assert "unknown (no tokens/s)" in describe_estimate(unknown)


def test_the_estimate_command_prices_a_config_and_refuses_one_without_a_grid(
    capsys: pytest.CaptureFixture,
) -> None:
    from pipeline_helpers import REPO

    from tiny_llm.cli import main

    assert main(["fit", "estimate", "--workflow-config", str(REPO / "config" / "cluster.yaml")]) == 2
    assert "plans no horizon study, no fit.verify run" in capsys.readouterr().err
    assert main(["fit", "estimate", "--workflow-config", str(REPO / "workflow_config.yaml")]) == 0
    out = capsys.readouterr()
    assert "fit.verify: demo-s x 1 seed(s), 145,152 tokens -> unknown (no tokens/s)" in out.err
    assert json.loads(out.out)["rows"][-1]["tokens"] == 145_152
