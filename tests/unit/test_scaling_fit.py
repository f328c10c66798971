"""The scaling fit on run directories (`python -m tiny_llm fit law|predict|report`): points from resolved.yaml
and result.json, bits per byte where every run has it, the prediction of a run and its check, the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiny_llm.budget import make_budget, non_embedding_parameter_count
from tiny_llm.cli import main
from tiny_llm.config import load_recipe, recipe_to_dict
from tiny_llm.errors import DataError
from tiny_llm.io import atomic_write_json, atomic_write_yaml, read_json
from tiny_llm.scaling.law import JointLaw
from tiny_llm.scaling.points import group_points, metrics_of, read_run

LAW = JointLaw(E=2.0, A=60.0, alpha=0.4, B=150.0, beta=0.35)
CHOOSE = "choose a new or empty one"
BPB_PER_NAT = 0.35  # a fixed tokenizer: bits per byte is the loss times a constant
WIDTHS = (64, 96, 128)  # three sizes of the tiny preset
HORIZONS = (1.0, 2.0, 4.0)


def recipe(width: int, horizon: float, seed: int):
    sets = [f"model.width={width}", f"training.tokens_per_parameter={horizon}", f"runtime.seed={seed}"]
    return load_recipe(["tiny"], sets)


def write_run(
    run_dir: Path, width: int, horizon: float, seed: int, noise: float, bpb: bool, rate: float = 1e4
) -> None:
    """A finished run as the trainer leaves it (the files the fit reads), its loss from LAW plus ``noise``."""
    r = recipe(width, horizon, seed)
    n, budget = non_embedding_parameter_count(r.model), make_budget(r)
    loss = float(LAW.loss(n, budget.tokens)) + noise
    final = {"loss": loss, "bpb": loss * BPB_PER_NAT} if bpb else {"loss": loss}
    atomic_write_yaml(run_dir / "resolved.yaml", recipe_to_dict(r))
    result = {"parameters": budget.parameters, "tokens": budget.tokens, "final_validation": final}
    atomic_write_json(run_dir / "result.json", {**result, "training_tokens_per_second": rate})


def write_grid(root: Path, bpb: bool | str = True, seeds: int = 2, sd: float = 5e-4) -> list[Path]:
    """3 sizes x 3 horizons x ``seeds``; bpb False: no run has it, "one": one run lacks it. The noise stays
    inside the Huber loss's quadratic zone (δ = 1e-3 in log space), where L-BFGS converges in few steps."""
    rng = np.random.default_rng(0)
    dirs = []
    for w in WIDTHS:
        for h in HORIZONS:
            for s in range(seeds):
                run = root / f"w{w}-h{h}-s{s}"
                has = bpb is True or (bpb == "one" and len(dirs) > 0)
                write_run(run, w, h, 42 + s, float(rng.normal(0, sd)), has)
                dirs.append(run)
    return dirs


def fit(tmp_path: Path, runs: list[Path], *extra: str) -> dict:
    out = tmp_path / "fit.json"
    args = ["fit", "law", "--runs", *map(str, runs), "--bootstrap", "20", "--output", str(out), *extra]
    assert main(args) == 0
    return read_json(out)


def test_runs_of_one_size_and_horizon_are_the_seeds_of_one_point(tmp_path: Path) -> None:
    points = group_points([read_run(d) for d in write_grid(tmp_path)])
    assert len(points) == 9 and all(len(p.runs) == 2 for p in points)
    assert [p.tokens_per_parameter for p in points[:3]] == list(HORIZONS)
    assert len({p.n for p in points}) == 3 and points[0].n == non_embedding_parameter_count(
        recipe(64, 1, 0).model
    )
    assert metrics_of(points) == ["loss", "bpb"]


@pytest.mark.parametrize(("bpb", "metrics"), [(True, ["loss", "bpb"]), (False, ["loss"]), ("one", ["loss"])])
def test_bits_per_byte_are_fitted_only_where_every_run_has_them(
    tmp_path: Path, bpb: object, metrics: list[str]
) -> None:
    result = fit(tmp_path, write_grid(tmp_path / "runs", bpb=bpb, seeds=1, sd=0.0))
    assert result["metrics"] == metrics
    assert set(result["fits"]) == set(metrics)
    loss = result["fits"]["loss"]["joint"]["parameters"]
    assert loss["alpha"]["value"] == pytest.approx(LAW.alpha, rel=1e-3)  # noise-free: the law comes back
    if "bpb" in metrics:  # bpb = c x loss: the same exponents, E, A and B times c
        bpb_law = result["fits"]["bpb"]["joint"]["parameters"]
        assert bpb_law["beta"]["value"] == pytest.approx(LAW.beta, rel=1e-3)
        assert bpb_law["E"]["value"] == pytest.approx(LAW.E * BPB_PER_NAT, rel=1e-3)
    else:
        assert result["bpb"] == "not every run has final_validation.bpb"


@pytest.mark.slow  # two fits, or a fit and the report's figures: 2-4 s
def test_fit_json_names_its_points_and_their_files_and_is_the_same_on_a_rerun(tmp_path: Path) -> None:
    runs = write_grid(tmp_path / "runs")
    first = (tmp_path / "fit.json").read_bytes() if fit(tmp_path, runs) else b""
    assert fit(tmp_path, runs) == json.loads(first)  # a rerun (an interrupted fit's) writes the same fit
    result = json.loads(first)
    sources = {s for p in result["points"] for r in p["runs"] for s in r["sources"]}
    assert sources == {str(d / f) for d in runs for f in ("resolved.yaml", "result.json")}
    joint = result["fits"]["loss"]["joint"]
    assert len(joint["residuals"]) == 18 and joint["r2"] > 0.99
    assert joint["noise_sd"]["source"] == "seeds (pooled within points)" and joint["noise_sd"]["dof"] == 9
    assert [row["tokens_per_parameter"] for row in joint["leave_one_horizon_out"]["horizons"]] == list(
        HORIZONS
    )
    assert len(joint["bootstrap"]["laws"]) == 20 and len(joint["compute_optimal"]) == 4
    assert all(size["intervals"].startswith("runs resampled") for size in result["fits"]["loss"]["per_size"])


@pytest.mark.slow  # two fits, or a fit and the report's figures: 2-4 s
def test_a_prediction_is_checked_against_the_run_it_predicted(tmp_path: Path) -> None:
    """The fit predicts a larger, longer run of the law to within one run's interval, and the check says so;
    the report page has the verification first, and both figures."""
    fit(tmp_path, write_grid(tmp_path / "runs"))
    verify = tmp_path / "verify"
    write_run(verify, 192, 8.0, 42, 0.0, bpb=True)
    atomic_write_yaml(tmp_path / "recipe.yaml", recipe_to_dict(recipe(192, 8.0, 42)))
    prediction = tmp_path / "prediction.json"
    args = ["fit", "predict", "--fit", str(tmp_path / "fit.json"), "--recipe", str(tmp_path / "recipe.yaml")]
    assert main([*args, "--output", str(prediction)]) == 0
    expected = read_json(prediction)
    truth = read_json(verify / "result.json")["final_validation"]
    assert expected["loss"]["value"] == pytest.approx(truth["loss"], abs=2e-3)
    assert expected["bpb"]["value"] == pytest.approx(truth["bpb"], abs=2e-3 * BPB_PER_NAT)
    assert expected["loss"]["noise_sd"] == pytest.approx(5e-4, rel=0.5)  # the seeds' SD
    report = tmp_path / "report"
    args = ["fit", "report", "--fit", str(tmp_path / "fit.json"), "--prediction", str(prediction)]
    assert main([*args, "--verify-run", str(verify), "--output-dir", str(report)]) == 0
    checked = read_json(report / "summary.json")["verification"]
    assert checked["loss"]["inside"] and checked["bpb"]["inside"]
    assert abs(checked["loss"]["error"]) < 2e-3
    text = (report / "report.md").read_text()
    assert text.index("Predicted before training") < text.index("Joint law, loss")
    assert "| loss |" in text and "| yes |" in text
    for figure in ("loss-fit.png", "isoflop.png"):
        assert (report / figure).stat().st_size > 10_000
    assert "<table>" in (report / "fit.html").read_text()


@pytest.mark.slow  # two fits, or a fit and the report's figures: 2-4 s
def test_a_run_off_the_prediction_is_reported_outside(tmp_path: Path) -> None:
    fit(tmp_path, write_grid(tmp_path / "runs"))
    verify = tmp_path / "verify"
    write_run(verify, 192, 8.0, 42, 0.5, bpb=False)  # half a nat above the law
    atomic_write_yaml(tmp_path / "recipe.yaml", recipe_to_dict(recipe(192, 8.0, 42)))
    prediction = tmp_path / "prediction.json"
    args = ["fit", "predict", "--fit", str(tmp_path / "fit.json"), "--recipe", str(tmp_path / "recipe.yaml")]
    assert main([*args, "--output", str(prediction)]) == 0
    args = ["fit", "report", "--fit", str(tmp_path / "fit.json"), "--prediction", str(prediction)]
    assert main([*args, "--verify-run", str(verify), "--output-dir", str(tmp_path / "report")]) == 0
    checked = read_json(tmp_path / "report" / "summary.json")["verification"]
    assert not checked["loss"]["inside"] and checked["loss"]["error"] > 0.4
    assert checked["bpb"] is None  # predicted, but the run has none to compare


def test_a_variant_gets_its_speedup_and_unreadable_runs_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = write_grid(tmp_path / "base", bpb=False)
    result = fit(tmp_path, base, "--variant", *(f"same:{d}" for d in base))
    rows = result["variants"]["same"]["speedup"]
    assert len(rows) == 9 and all(r["compute"]["value"] == pytest.approx(1.0) for r in rows)
    assert all(r["wall_clock"]["value"] == pytest.approx(1.0) for r in rows)  # the same tokens/s
    (base[0] / "result.json").write_text("{", encoding="utf-8")
    assert main(["fit", "law", "--runs", *map(str, base), "--output", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(base[0] / "result.json") in err and "\n" not in err
    with pytest.raises(DataError, match="not a finished training run"):
        (base[1] / "result.json").write_text("{}", encoding="utf-8")
        read_run(base[1])


def test_the_report_refuses_a_folder_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("# my notes\n", encoding="utf-8")
    args = ["fit", "report", "--fit", str(tmp_path / "fit.json"), "--output-dir", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert (
        err == f"error: --output-dir {out} is a non-empty directory that tiny-llm did not write; {CHOOSE}\n"
    )
    assert (out / "report.md").read_text(encoding="utf-8") == "# my notes\n" and len(list(out.iterdir())) == 1
    assert main([*args[:-1], str(tmp_path / "new"), "--prediction", "p.json"]) == 2
    assert "--prediction and --verify-run go together" in capsys.readouterr().err
