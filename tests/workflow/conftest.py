"""Dry runs that several workflow tests read: each is one Snakemake process (~2 s of CPU to import, parse and
plan), so tests that look at the same DAG share it instead of planning it again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from workflow_helpers import DEMO_STAGES, REPO, WITHOUT_TORCH, snakemake, snakemake_command, snakemake_env


@pytest.fixture(scope="session")
def demo_dry_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """The shipped config's default target, dry-run by a controller that cannot import torch."""
    workdir = tmp_path_factory.mktemp("demo-default")
    args = snakemake_command(workdir, None, "-n", "--configfile", str(REPO / "workflow_config.yaml"))
    assert args[1:3] == ["-m", "snakemake"]
    command = [sys.executable, "-c", WITHOUT_TORCH, *args[3:]]
    return subprocess.run(
        command, cwd=workdir, capture_output=True, text=True, timeout=240, env=snakemake_env()
    )


@pytest.fixture(scope="session")
def demo_stages_dry_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """Every stage target of the shipped config in one dry run, with the two cores of a small local run."""
    workdir = tmp_path_factory.mktemp("demo-stages")
    return snakemake(workdir, REPO / "workflow_config.yaml", "-n", "--cores", "2", *DEMO_STAGES)


@pytest.fixture(scope="session")
def cluster_dry_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """config/cluster.yaml: the plain runs, the data and the GH200 tuning in one dry run."""
    workdir = tmp_path_factory.mktemp("cluster")
    config: Path = REPO / "config" / "cluster.yaml"
    return snakemake(workdir, config, "-n", "runs", "data", "results/gh200-tuning/selected.yaml")
