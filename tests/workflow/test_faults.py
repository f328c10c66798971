"""The fault-injection benchmark's short version (benchmarks/faults.py): a 2 -> 2 deterministic campaign, one
of whose stage-1 grid points diverges, killed and damaged three times at seeded random points and rerun until
complete, ends bitwise where the uninterrupted campaign ends."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def faults(
    tmp_path_factory: pytest.TempPathFactory, fault_benchmark: ModuleType
) -> tuple[dict[str, Any], Path]:
    workdir = tmp_path_factory.mktemp("faults")
    kinds = ["kill_job", "kill_controller", "truncate_latest"]
    report = fault_benchmark.run(workdir, [3], 3, shape="short", kinds=kinds)
    return report, workdir


def test_faulted_campaign_equals_the_uninterrupted_one(faults: tuple[dict[str, Any], Path]) -> None:
    report, _ = faults
    (seed,) = report["seeds"]
    # a cut latest.pt needs an interrupted run that had saved one: the other two always land
    assert seed["faults_injected"] >= 2, seed
    assert {"kill_job", "kill_controller"} <= {fault["kind"] for fault in seed["faults"]}, seed
    assert seed["reruns"] >= 1 and seed["runs_compared"] == 4
    assert seed["differences"] == [], json.dumps(seed, indent=1)
    assert report["total_differences"] == 0
    # exit 0 means complete: no session exited 0 with jobs left, and the last left none
    assert seed["exit_0_with_jobs_left"] == 0 and seed["sessions"][-1]["jobs_left"] == 0, seed["sessions"]


def test_a_diverged_grid_point_ranks_last_and_the_campaign_goes_on(
    faults: tuple[dict[str, Any], Path],
) -> None:
    root = faults[1] / "reference" / "results" / "campaign"
    diverged = json.loads((root / "stage1/t-s-lr100-wd0.1/result.json").read_text())
    assert diverged["status"] == "diverged" and diverged["final_validation"] is None
    assert 0 < diverged["step"] < 36 and diverged["error"].startswith(
        f"step {diverged['step'] + 1}: non-finite"
    )
    ranking = json.loads((root / "stage1/ranking.json").read_text())
    assert [(r["run"], r["loss"] is None) for r in ranking] == [
        ("t-s-lr0.003-wd0.1", False),
        ("t-s-lr100-wd0.1", True),
    ]
    child = yaml.safe_load((root / "stage2/t-m-parent0-beta2-0.99/resolved.yaml").read_text())
    assert child["optimizer"]["lr"] == 0.003  # the finite run was promoted
    rows = json.loads((root / "report/comparison.json").read_text())
    rows = {r["run"]: r for r in rows if r.get("kind", "run") == "run"}  # besides per-configuration rows
    assert len(rows) == 4 and rows["t-s-lr100-wd0.1"]["loss"] is None
    assert all(rows[run]["loss"] > 0 for run in rows if run != "t-s-lr100-wd0.1")
