"""The analysis stage end to end on a tiny run: a job per (epoch state, data case), then the summary."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from workflow_helpers import snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow


def test_tiny_run_is_analysed_at_every_epoch_on_both_cases(tmp_path: Path) -> None:
    config = tiny_config()
    config["analysis"] = {"runs": ["tiny-a"], "noise_samples": 1, "random_samples": 1, "amp": True}
    path = write_config(tmp_path / "tiny.yaml", config)
    proc = snakemake(tmp_path, path, "analysis", "--cores", "2", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = tmp_path / "results" / "analysis" / "tiny-a" / "s1-r1-seed42-amp"
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    epochs = sorted(p.name for p in (tmp_path / "results" / "runs" / "tiny-a").glob("epoch-*.pt"))
    assert len(rows) == 2 * len(epochs) >= 4
    assert all((folder / name).stat().st_size > 5000 for name in ("alignment.png", "noise-alignment.png"))
    again = snakemake(tmp_path, path, "analysis", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_checkpoint_the_run_never_saves_is_refused_when_the_dag_is_built(tmp_path: Path) -> None:
    config = tiny_config()
    config["analysis"] = {"runs": ["tiny-a"], "checkpoints": ["epoch-099"]}
    proc = snakemake(tmp_path, write_config(tmp_path / "bad.yaml", config), "-n", "analysis")
    assert proc.returncode != 0
    assert "analysis.runs: tiny-a: the run saves no epoch-099" in proc.stdout + proc.stderr
