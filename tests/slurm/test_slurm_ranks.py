"""A size with num_gpus: 2 through a real Slurm cluster with profiles/slurm: one sbatch job on one node with
two CPUs (the size's 1 thread per rank), in which `tiny_llm launch` runs 2 gloo ranks to a complete run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from slurm_helpers import (
    REPO,
    REQUIRE_ENV,
    derive_profile,
    detect_cluster,
    repository_snakemake,
    run_snakemake,
    sacct_states,
    submitted_jobs,
    unavailable_reason,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RUN = "tiny-2ranks"
RESULT = f"results/runs/{RUN}/result.json"
CACHE = "results/data/cache/manifest.json"


def workflow_config(corpus: Path, tokenizer: Path) -> dict:
    """The `tiny` preset (a short budget) as a size of 2 CPU ranks."""
    size = {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10, "num_gpus": 2}
    training = {"tokens_per_parameter": 0.2, "epoch_tokens_per_parameter": 0.1, "log_every": 1}
    return {
        "data": {"corpus": str(corpus), "tokenizer": str(tokenizer), "cache_dir": "results/data/cache"},
        "sizes": {"tiny": size},
        "recipe_defaults": {"training": training},
        "runs": {RUN: {"size": "tiny"}},
    }


def test_a_two_rank_size_runs_as_one_slurm_job_of_two_cpu_ranks(
    tmp_path: Path, tiny_corpus_dir: Path, tiny_tokenizer_dir: Path
) -> None:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{REQUIRE_ENV} is set but {reason}")
        pytest.skip(reason)
    shutil.copy(REPO / "workflow_config.yaml", tmp_path / "workflow_config.yaml")
    config = tmp_path / "ranks.yaml"
    config.write_text(yaml.safe_dump(workflow_config(tiny_corpus_dir, tiny_tokenizer_dir)), encoding="utf-8")
    # The token cache is built locally first (the default profile): only the training job goes through Slurm.
    cache = repository_snakemake(tmp_path, "--cores", "2", CACHE, configfile=config)
    local = subprocess.run(cache, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert local.returncode == 0, (local.stdout + local.stderr)[-6000:]
    profile = derive_profile(tmp_path / "profile", detect_cluster(), config, cpu_only=True)
    proc = run_snakemake(tmp_path, profile, RESULT, "--verbose", timeout=400)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    (train,) = submitted_jobs(output)
    assert train.rule == "train_run", output[-6000:]
    call = next(ln for ln in output.splitlines() if ln.startswith("sbatch call:") and "rule_train_run" in ln)
    assert "--cpus-per-task=2" in call and "--nodes=1" in call and "--gpus" not in call, call
    assert wait_for(lambda: sacct_states([train.slurm_id]) == {train.slurm_id: "COMPLETED"}, 30)
    run_dir = tmp_path / "results" / "runs" / RUN
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert result["step"] > 0
    environment = json.loads((run_dir / "environment.json").read_text(encoding="utf-8"))
    assert environment["slurm"]["SLURM_JOB_ID"] == train.slurm_id
    assert environment["slurm"]["SLURM_CPUS_PER_TASK"] == "2" and environment["threads"] == 1  # per rank
    job_log = (tmp_path / "logs" / "train_run" / f"{RUN}.log").read_text(encoding="utf-8")
    assert "final validation loss" in job_log
    assert "python -m tiny_llm launch --nproc-per-node 2" in train.log.read_text(encoding="utf-8")
