"""The scaling-fit stage end to end on the CPU: a horizon grid of three tiny sizes, the fit, its prediction of
a longer run, that run (killed mid-way and resumed by the rerun), the report; a rerun then has nothing to do.
The DAG puts the prediction before the verify run's training."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from test_workflow_e2e import job_counts, kill_trainer_after_checkpoint, metrics_rows
from workflow_helpers import snakemake, snakemake_command, snakemake_env, tiny_config, write_config

from tiny_llm.io import read_json

STUDY = {
    "sizes": ["tiny", "wide", "wider"],
    "horizons": [0.1, 0.2],
    "seeds": [42],
    "overrides": {
        "optimizer": {"lr_schedule": "wsd", "warmup_fraction": 0, "warmup_steps": 3},
        "training": {"epoch_tokens_per_parameter": 0.05},
        "data": {"shuffle_group_size": 1},
    },
}
SIZES = {
    "tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10},
    "wide": {"preset": "tiny", "overrides": {"model": {"width": 96}}, "threads": 1, "mem_mb": 1000},
    "wider": {"preset": "tiny", "overrides": {"model": {"width": 128}}, "threads": 1, "mem_mb": 1000},
}
# demo-s-like: long enough (2 tokens per parameter, ~260 updates) to be killed mid-way on a busy machine
FIT = {"default_target": True, "verify": {"size": "tiny", "horizon": 2.0}, "bootstrap": 20}


def fit_config(workdir: Path) -> Path:
    config = {**tiny_config(), "sizes": SIZES, "runs": {}, "horizons": STUDY, "fit": FIT}
    return write_config(workdir / "fit.yaml", config)


def dag_edges(dot: str) -> set[tuple[str, str]]:
    """(rule, rule) of every edge of `snakemake --dag`'s graph."""
    names = dict(re.findall(r'^\s*(\d+)\[label = "([^"\\]+)', dot, re.MULTILINE))
    return {(names[a], names[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, re.MULTILINE)}


def test_the_verify_run_trains_only_after_the_fit_predicted_it(tmp_path: Path) -> None:
    proc = snakemake(tmp_path, fit_config(tmp_path), "fit", "--dag", "dot")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    edges = dag_edges(proc.stdout)
    assert ("fit_scaling", "predict_run") in edges and ("predict_run", "train_verify") in edges
    assert ("train_branch", "fit_scaling") in edges and ("train_verify", "report_fit") in edges
    assert not any(a == "train_verify" and b in ("fit_scaling", "predict_run") for a, b in edges)


@pytest.mark.slow  # 3 trunks, 6 branches and the verify run of the tiny preset: ~1-2 minutes
def test_an_interrupted_verify_run_resumes_and_a_rerun_has_nothing_to_do(tmp_path: Path) -> None:
    config = fit_config(tmp_path)
    verify = tmp_path / "results" / "fit" / "verify"
    with open(tmp_path / "first.log", "w") as out:
        proc = subprocess.Popen(
            snakemake_command(tmp_path, config, "fit", "--cores", "2"),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=snakemake_env(),
            start_new_session=True,
        )
        try:
            kill_trainer_after_checkpoint(proc, verify, timeout=600)
            assert proc.wait(timeout=120) != 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    # the prediction was written before the run began, and survives it
    prediction = read_json(tmp_path / "results" / "fit" / "prediction.json")
    assert (verify / "latest.pt").exists() and not (verify / "result.json").exists()
    before = metrics_rows(verify)

    second = snakemake(tmp_path, config, "fit", "--cores", "2", timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    rules = set(job_counts(second.stdout + second.stderr)) - {"total"}
    assert rules == {"train_verify", "report_fit", "fit"}, rules  # nothing upstream of the verify run again
    after = metrics_rows(verify)
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    resumed = [row["step"] for row in after[common:] if row.get("event") == "train"]
    first = [row["step"] for row in before if row.get("event") == "train"]
    assert resumed and first and resumed[0] > first[0] and resumed[0] > 4  # past the saved state: a resume
    assert read_json(tmp_path / "results" / "fit" / "prediction.json") == prediction

    summary = read_json(tmp_path / "results" / "report" / "fit" / "summary.json")
    realised = read_json(verify / "result.json")["final_validation"]["loss"]
    assert summary["verification"]["loss"]["realised"] == realised
    assert summary["verification"]["loss"]["predicted"] == prediction["loss"]["value"]
    fit = read_json(tmp_path / "results" / "fit" / "fit.json")
    assert len(fit["points"]) == 6 and len({p["n"] for p in fit["points"]}) == 3

    third = snakemake(tmp_path, config, "fit", "--cores", "2", "-n")
    assert third.returncode == 0 and "Nothing to be done" in third.stdout + third.stderr
