"""The fit's prediction of one run before it trains, and the check of that run once it has.

prediction.json gives, per fitted metric, the joint law's value at the run's (N, D) with two intervals: the
law's own (the bootstrap's laws at that point) and the interval one run should fall in (each bootstrap law
plus a draw of one run's noise, the fit's noise SD). The verification sets the run's final loss against the
second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tiny_llm.budget import make_budget, non_embedding_parameter_count
from tiny_llm.config import RecipeConfig
from tiny_llm.errors import REBUILD_RESULT, DataError
from tiny_llm.io import read_json_mapping
from tiny_llm.scaling.bootstrap import estimate, interval
from tiny_llm.scaling.law import JointLaw
from tiny_llm.scaling.points import read_run

NOISE_SEED_OFFSET = 2
"""The noise draws use the fit's bootstrap seed plus this (its points and a variant's use +0 and +1)."""


def laws_of(joint: dict[str, Any]) -> tuple[JointLaw, list[JointLaw | None]]:
    """fit.json's joint law and its bootstrap laws (None: a failed refit)."""
    law = JointLaw(*(joint["parameters"][name]["value"] for name in JointLaw.NAMES))
    replicates = [
        None if any(v is None for v in row) else JointLaw(*map(float, row))
        for row in joint["bootstrap"]["laws"]
    ]
    return law, replicates


def predict_point(joint: dict[str, Any], n: float, d: float, confidence: float, seed: int) -> dict[str, Any]:
    law, replicates = laws_of(joint)
    samples = np.array([np.nan if w is None else float(w.loss(n, d)) for w in replicates])
    noise = joint["noise_sd"]["value"] or 0.0
    one_run = samples + np.random.default_rng(seed).normal(0.0, noise, samples.shape)
    return {
        **estimate(float(law.loss(n, d)), samples, confidence),
        "prediction_interval": interval(one_run, confidence),
        "noise_sd": noise,
    }


def prediction(fit: dict[str, Any], recipe: RecipeConfig, recipe_path: str, fit_path: str) -> dict[str, Any]:
    """prediction.json's content for the run of ``recipe``."""
    n = non_embedding_parameter_count(recipe.model)
    d = make_budget(recipe).tokens
    settings = fit["settings"]
    confidence, seed = settings["confidence"], settings["seed"] + NOISE_SEED_OFFSET
    out: dict[str, Any] = {
        "fit": fit_path,
        "recipe": recipe_path,
        "n": n,
        "d": d,
        "compute": 6.0 * n * d,
        "tokens_per_parameter": recipe.training.tokens_per_parameter,
        "confidence": confidence,
    }
    for metric in ("loss", "bpb"):
        joint = fit["fits"].get(metric, {}).get("joint")
        out[metric] = None if joint is None else predict_point(joint, n, d, confidence, seed)
    return out


def verification(predicted: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """The run's realised values against the prediction: error and whether each fell inside its interval."""
    run = read_run(run_dir)
    if run.loss is None:
        raise DataError(
            f"{run_dir}/result.json: the verify run has no final validation loss; {REBUILD_RESULT}"
        )
    found = read_json_mapping(Path(run_dir) / "result.json", REBUILD_RESULT)
    if int(found["tokens"]) != predicted["d"] or run.n != predicted["n"]:
        raise DataError(
            f"{run_dir}: trained N={run.n}, D={found['tokens']}, but the prediction is for "
            f"N={predicted['n']}, D={predicted['d']}; rerun the fit (snakemake fit)"
        )
    out: dict[str, Any] = {"run": str(run_dir), "prediction": predicted}
    for metric in ("loss", "bpb"):
        expected, realised = predicted.get(metric), run.value(metric)
        if expected is None or realised is None:
            out[metric] = None
            continue
        low, high = expected["prediction_interval"]
        out[metric] = {
            "predicted": expected["value"],
            "prediction_interval": [low, high],
            "realised": realised,
            "error": realised - expected["value"],
            "inside": bool(low <= realised <= high),
        }
    return out
