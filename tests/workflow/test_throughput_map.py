"""The throughput map as a workflow stage: a tiny map on the CPU under a memory cap finds its frontier through
the checkpoint, reports it, resumes after an interruption and then has nothing to do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_helpers import REPO, snakemake, tiny_config, write_config

from tiny_llm.tuning.throughput_map import frontier

# What the updates allocate beyond the built engine (optimizer state, activations): a 5 MiB cap fits micro
# batches of 4 x 32 and 2 x 64 tokens, and context 64 at 1 sequence already needs more than 3 MiB.
MAP = {
    "sizes": ["tiny"],
    "contexts": [32, 64],
    "max_micro_batch": 64,
    "data_mode": "synthetic",
    "warmup": 1,
    "steps": 1,
    "windows": 2,
    "max_windows": 3,
    "max_spread": 0.0,  # every spread is wide: each measured point takes its third window
    "timeout_seconds": 120,
    "overrides": {"runtime": {"memory_limit_mb": 5, "cpu_threads": 1}},
}


def test_frontier_doubles_to_an_out_of_memory_seen_twice() -> None:
    statuses = {(1, "first"): "ok", (2, "first"): "ok", (4, "first"): "memory_limit"}
    flaky = {**statuses, (4, "confirm"): "ok", (8, "first"): "memory_limit", (8, "confirm"): "memory_limit"}
    walk = list(frontier(lambda m, t: {"status": statuses.get((m, t), "memory_limit")}, 64))
    assert walk == [(1, "first"), (2, "first"), (4, "first"), (4, "confirm")]
    # an out-of-memory that does not repeat is no frontier: the doubling goes on
    assert list(frontier(lambda m, t: {"status": flaky[(m, t)]}, 64))[-2:] == [(8, "first"), (8, "confirm")]
    assert list(frontier(lambda m, t: {"status": "ok"}, 4)) == [(1, "first"), (2, "first"), (4, "first")]
    assert list(frontier(lambda m, t: {"status": "failed"}, 4)) == [(1, "first")]


@pytest.mark.slow
def test_gh200_grid_dry_runs_and_is_priced(tmp_path: Path) -> None:
    config = REPO / "config" / "throughput-gh200.yaml"
    proc = snakemake(tmp_path, config, "-n", "throughput")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checkpoint jobs" in proc.stdout and "bench_throughput " in proc.stdout  # the first point
    estimate = subprocess.run(
        [sys.executable, "-m", "tiny_llm", "throughput", "estimate", "--workflow-config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    )
    priced = json.loads(estimate.stdout)
    assert priced["lines"] == 16 and priced["gpu_hours_at_most"] > 0
    assert priced["parameters"]["500m"] == 516_814_080


@pytest.mark.slow
def test_tiny_map_finds_its_frontier_resumes_and_reruns_nothing(tmp_path: Path) -> None:
    config = tiny_config()
    config.update(runs={}, tuning={"default_profiles": []}, throughput=MAP)
    path = write_config(tmp_path / "c.yaml", config)
    points = tmp_path / "results" / "throughput" / "tiny"
    # An interrupted map: only its first point was measured.
    first = snakemake(tmp_path, path, "--cores", "2", "results/throughput/tiny/ctx32/m1-first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    measured = (points / "ctx32" / "m1-first.json").stat().st_mtime_ns
    proc = snakemake(tmp_path, path, "--cores", "2", "throughput", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (points / "ctx32" / "m1-first.json").stat().st_mtime_ns == measured  # resumed, not redone
    summary = json.loads((tmp_path / "results" / "throughput" / "summary.json").read_text())
    lines = {row["context"]: row for row in summary["lines"]}
    for row in lines.values():
        walk = [(p["micro_batch_size"], p["trial"], p["status"], p.get("error")) for p in row["points"]]
        assert row["out_of_memory_confirmed"], walk  # what each point of the line ended as, if not
        assert row["max_micro_batch_fits"] >= 1, walk
        last = row["points"][-1]
        assert last["trial"] == "confirm" and last["micro_batch_size"] == 2 * row["max_micro_batch_fits"]
        assert row["tokens_per_second"] > 0 and row["gpu_hours_20_tokens_per_parameter"] > 0
        assert all(len(p["window_tokens_per_second"]) == 3 for p in row["points"] if p["status"] == "ok")
    assert lines[64]["max_micro_batch_fits"] <= lines[32]["max_micro_batch_fits"]  # longer blocks, fewer fit
    assert "| tiny | 32 |" in (tmp_path / "results" / "throughput" / "throughput.md").read_text()
    assert (tmp_path / "results" / "throughput" / "throughput.png").stat().st_size > 0
    again = snakemake(tmp_path, path, "--cores", "2", "throughput")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_max_windows_below_windows_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tiny_config()
    config.update(runs={}, tuning={"default_profiles": []}, throughput={**MAP, "max_windows": 1})
    proc = snakemake(tmp_path, write_config(tmp_path / "c.yaml", config), "-n", "throughput")
    assert proc.returncode != 0
    assert "throughput.max_windows: 0 or at least windows (2), got 1" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_failed_point_is_named_in_the_table_and_on_the_console_and_measured_again_when_asked(
    tmp_path: Path,
) -> None:
    """A point that fails (a GPU-only attention kernel on the CPU) ends its line with a reason, the run names
    its record, a rerun leaves it, and --forcerun on the record measures that point again."""
    config = tiny_config()
    broken = {**MAP, "contexts": [32], "overrides": {"runtime": {"sdpa_backend": "flash", "cpu_threads": 1}}}
    config.update(runs={}, tuning={"default_profiles": []}, throughput=broken)
    path = write_config(tmp_path / "c.yaml", config)
    proc = snakemake(tmp_path, path, "--cores", "2", "throughput", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = tmp_path / "results" / "throughput" / "tiny" / "ctx32" / "m1-first.json"
    reason = json.loads(record.read_text())["error"].splitlines()[0]
    assert json.loads(record.read_text())["status"] == "failed"
    table = (tmp_path / "results" / "throughput" / "throughput.md").read_text()
    assert f"| failed: {reason[:100]}" in table
    console = (proc.stdout + proc.stderr).splitlines()
    assert f"  results/throughput/tiny/ctx32/m1-first.json: failed: {reason}" in console, console[-8:]
    measured = record.stat().st_mtime_ns
    assert "Nothing to be done" in snakemake(tmp_path, path, "--cores", "2", "throughput").stderr
    point = "results/throughput/tiny/ctx32/m1-first.json"
    again = snakemake(tmp_path, path, "--cores", "2", "throughput", "--forcerun", point, timeout=400)
    assert again.returncode == 0 and record.stat().st_mtime_ns != measured, again.stdout + again.stderr


@pytest.mark.slow
def test_an_edited_map_recipe_is_refused_and_the_advice_works(tmp_path: Path) -> None:
    config = tiny_config()
    config.update(runs={}, tuning={"default_profiles": []}, throughput=MAP)
    path = write_config(tmp_path / "c.yaml", config)
    recipe, point = "results/throughput/tiny/recipe.yaml", "results/throughput/tiny/ctx32/m1-first.json"
    assert snakemake(tmp_path, path, "--cores", "2", recipe).returncode == 0
    text = (tmp_path / recipe).read_text()
    assert "  width: 64\n" in text
    (tmp_path / recipe).write_text(text.replace("  width: 64\n", "  width: 96\n"))  # another model
    proc = snakemake(tmp_path, path, "--cores", "2", point)
    assert proc.returncode != 0 and not (tmp_path / point).exists()  # nothing measured on it
    log = (tmp_path / "logs/bench_throughput/tiny-ctx32-m1-first.log").read_text()
    assert log.strip() == (
        f"error: {recipe} is not what the workflow config says (edited since the workflow wrote it?); delete "
        "it and rerun the same snakemake command: the workflow writes it again from the config"
    )
    (tmp_path / recipe).unlink()  # as it says
    assert snakemake(tmp_path, path, "--cores", "2", point).returncode == 0
    measured = json.loads((tmp_path / point).read_text())
    assert measured["status"] == "ok" and "width: 64" in (tmp_path / recipe).read_text()
