"""The tuner as Snakemake jobs: static DAG by rank, one job per candidate, selection, rerun is a no-op."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow_helpers import snakemake, tiny_config, write_config

from tiny_llm.config import load_recipe
from tiny_llm.pipeline.timing import job_times

TINY_PROFILE = {
    "size": "tiny",
    "space": "cpu",
    "data_mode": "synthetic",
    "budget_minutes": 5,
    "candidate_timeout_seconds": 120,
    "min_start_seconds": 5,
    "warmup": 1,
    "steps": 1,
    "windows": 1,
    "stage1": [[8, False], [16, False]],
    "attention_variants": [],  # stages 2 and 4 are left out to keep this test short;
    "cpu_amp_variants": [False],
    "threads": [],  # the unit tests cover their ranks
}
SLOTS = ["s1-m8-eager", "s1-m16-eager", "s3-r0-fp32"]


def tuning_config(**profile) -> dict:
    config = tiny_config()
    config["runs"] = {}
    config["tuning"] = {"default_profiles": [], "profiles": {"toy": {**TINY_PROFILE, **profile}}}
    return config


def test_shipped_demo_includes_cpu_tuning(demo_dry_run: subprocess.CompletedProcess) -> None:
    proc = demo_dry_run  # the default target
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "results/cpu-tuning/selected.yaml" in proc.stdout
    assert "python -m tiny_llm tune candidate" in proc.stdout
    assert "cuda-graph" not in proc.stdout  # a CPU cannot capture a CUDA graph: no such candidate


def test_gh200_profile_dag_is_static(cluster_dry_run: subprocess.CompletedProcess) -> None:
    proc = cluster_dry_run  # results/gh200-tuning/selected.yaml beside the runs, which do not benchmark
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 20m at its campaign batch, 128 sequences per update: all 10 stage-1 pairs (up to the reference's
    # micro 128), 2 x 2 attention, 2 compile modes, the CUDA graph for the best; no threads stage on a GPU
    assert proc.stdout.count("rule bench_candidate:") == 10 + 4 + 2 + 1
    assert "--slot s1-m128-compile" in proc.stdout
    assert "--slot s2-r1-cudnn" in proc.stdout and "--slot s4-r0-cuda-graph " in proc.stdout
    assert "--slot s4-r0-t" not in proc.stdout and "--slot s5-" not in proc.stdout


@pytest.mark.slow
def test_bad_profile_is_rejected_naming_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tuning_config(stage1=[[64, False]]))
    proc = snakemake(tmp_path, config, "-n", "results/toy-tuning/selected.yaml")
    assert proc.returncode != 0
    assert (
        "tuning.profiles.toy.stage1: every micro batch exceeds the 16 sequences" in proc.stdout + proc.stderr
    )


@pytest.mark.slow
def test_tuning_runs_each_candidate_as_a_job_and_selects(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tuning_config())
    target = "results/toy-tuning/selected.yaml"
    proc = snakemake(tmp_path, config, target, "--cores", "2", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = tmp_path / "results" / "toy-tuning"
    results = {s: json.loads((folder / "candidates" / f"{s}.json").read_text()) for s in SLOTS}
    assert all(r["status"] == "ok" for r in results.values())
    fastest = max(SLOTS[:2], key=lambda s: results[s]["tokens_per_second"])
    # cpu_amp false is the best candidate itself: reused, not rerun
    assert results["s3-r0-fp32"]["parent"] == results["s3-r0-fp32"]["reused_from"] == fastest
    summary = json.loads((folder / "summary.json").read_text())
    best = summary["selected"]
    assert best["tokens_per_second"] == max(r["tokens_per_second"] for r in results.values())
    assert results[best["name"]]["reused_from"] is None
    selected = load_recipe([str(folder / "selected.yaml")])
    assert selected.training.micro_batch_size == summary["selected"]["settings"]["training.micro_batch_size"]
    assert yaml.safe_load((folder / "selected.yaml").read_text())["model"]["vocab_size"] == 512
    assert (folder / "throughput.png").stat().st_size > 0
    profile = yaml.safe_load((folder / "profile.yaml").read_text())
    assert "sets" not in profile and profile["overrides"]["training"]["log_every"] == 1
    assert json.loads((folder / "progress.json").read_text())["done"] == len(SLOTS)
    # the timed workers, forked by the run's fork server (shared_startup) as its other jobs are
    served = [json.loads(line) for line in (tmp_path / "logs" / "fork-server.jsonl").read_text().splitlines()]
    workers = [r for r in served if "pid" in r and r["argv"][0] == "benchmark-worker"]
    assert [r["exit"] for r in workers] == [0, 0]  # s3-r0-fp32 reused its parent's: no worker
    candidates = [j for j in job_times(tmp_path / "logs") if j.rule == "bench_candidate"]
    assert sum(j.cpu_s or 0 for j in candidates) >= sum(r["cpu_s"] for r in workers) > 0  # counted in
    again = snakemake(tmp_path, config, target, "--cores", "2")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
