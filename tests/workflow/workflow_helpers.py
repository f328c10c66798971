"""Helpers for the workflow tests: run snakemake on the repository's Snakefile in a scratch directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the shared command builder

from snakemake_driver import REPO  # noqa: E402
from snakemake_driver import SNAKEFILE as SNAKEFILE  # noqa: E402 - the tests import it from here
from snakemake_driver import snakemake_command as repository_snakemake  # noqa: E402

WITHOUT_TORCH = (
    "import sys\nsys.modules['torch'] = None\nfrom snakemake.cli import main\nmain(sys.argv[1:])\n"
)
"""Snakemake's command line in a process where importing torch fails."""

DEMO_STAGES = ("export", "campaign", "analysis", "tuning", "packed", "runs")
"""The shipped config's stage targets; the jobs a stage's test counts are the same in their joint DAG."""


NO_SLURM_CONTROLLER = REPO / "tests" / "no-slurm-controller"
"""A `scontrol` that answers "no controller" at once (see the script): these tests run no Slurm job."""


def snakemake_env() -> dict[str, str]:
    """A Snakemake process's environment in these tests: unbuffered, no wait for a Slurm controller."""
    path = f"{NO_SLURM_CONTROLLER}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": path}


def snakemake_command(workdir: Path, configfile: Path | None, *args: str) -> list[str]:
    """A snakemake call on the repository's Snakefile with ``workdir`` as working directory."""
    # Every job's block, which the default profile leaves out of the console; last, as --quiet takes all
    # the words after it.
    return repository_snakemake(workdir, *args, "--quiet", "host", configfile=configfile)


def snakemake(
    workdir: Path, configfile: Path | None, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_command(workdir, configfile, *args),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=snakemake_env(),
        stdin=subprocess.DEVNULL,
    )


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def tiny_config(**runs: dict) -> dict:
    """A workflow config on the `tiny` preset: embedded corpus, trained 512-token tokenizer, 1-thread jobs."""
    return {
        "data": {"corpus": "embedded", "validation_fraction": 0.05, "tokenizer": "train"},
        "sizes": {"tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}},
        "recipe_defaults": {
            "training": {"checkpoint_policy": "interval", "checkpoint_every": 4, "log_every": 1}
        },
        "runs": runs or {"tiny-a": {"size": "tiny"}},
    }
