"""The tiny 6 -> 4 -> 2 campaign end to end on the CPU: interrupted (Ctrl-C) during stage 2 and rerun to the
end, then rerun after success and rerun with a changed setting (rejected)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from workflow_helpers import snakemake, snakemake_command, tiny_config, write_config

pytestmark = pytest.mark.slow

STAGE2_RUNS = [
    "t-m-parent0-beta2-0.95",
    "t-m-parent0-beta2-0.99",
    "t-m-parent1-beta2-0.95",
    "t-m-parent1-beta2-0.99",
]


def campaign_config() -> dict:
    """Three toy sizes with tiny budgets; deterministic, so a resumed run must equal an uninterrupted one."""
    config = tiny_config()
    config["runs"] = {}
    config["data"]["prepare_validation_tokens"] = 8192  # keeps every final full validation short
    size = {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}
    budget = {"tokens_per_parameter": 0.125, "epoch_tokens_per_parameter": 0.0625}
    config["sizes"] = {
        "t-s": {**size, "overrides": {"training": budget}},
        # stage 2 trains longer (4 epochs of small batches), so the test can interrupt it mid-run
        "t-m": {
            **size,
            "overrides": {"model": {"num_layers": 3}, "training": {**budget, "tokens_per_parameter": 0.25}},
        },
        "t-l": {**size, "overrides": {"model": {"num_layers": 4}, "training": budget}},
    }
    config["campaign"] = {
        "stages": [
            {"size": "t-s", "lr": [3e-4, 1e-3, 3e-3], "weight_decay": [0.0, 0.1], "beta2": [0.95]},
            {"size": "t-m", "parents": 2, "beta2": [0.95, 0.99]},
            {"size": "t-l", "parents": 2},
        ],
        "batch_tokens": {"t-m": 512},
        "overrides": {
            "training": {"log_every": 2},
            "evaluation": {"subset_blocks": 8},
            "runtime": {"deterministic": True},
        },
        "throughput": {"t-s": 20000.0, "t-m": 15000.0, "t-l": 10000.0},
    }
    return config


def rankings(root: Path) -> dict[str, list[tuple[str, float]]]:
    out = {}
    for stage in ("stage1", "stage2", "stage3"):
        rows = json.loads((root / "results/campaign" / stage / "ranking.json").read_text())
        out[stage] = [(r["run"], r["loss"]) for r in rows]
    return out


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def first_train_step(metrics: Path) -> int | None:
    if not metrics.is_file():
        return None
    for line in metrics.read_text().splitlines():
        row = json.loads(line) if line.endswith("}") else {}
        if row.get("event") == "train":
            return row["step"]
    return None


def interrupt_during_stage2(workdir: Path, config: Path) -> str:
    """Start the campaign and send Ctrl-C (SIGINT to the process group) once a stage-2 run is training."""
    cmd = snakemake_command(workdir, config, "--cores", "2", "campaign")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (workdir / "interrupted.log").open("w") as log:
        proc = subprocess.Popen(
            cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + 240
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                runs = workdir / "results/campaign/stage2"
                if any(first_train_step(runs / run / "metrics.jsonl") is not None for run in STAGE2_RUNS):
                    os.killpg(proc.pid, signal.SIGINT)
                    break
                time.sleep(0.05)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return (workdir / "interrupted.log").read_text()


@dataclass
class Campaign:
    """The finished campaign plus what the test saw at the interruption."""

    workdir: Path
    config: Path
    unfinished: list[str]
    stage1_files: dict[Path, tuple[int, bytes]]
    lines_at_interrupt: dict[str, int]


@pytest.fixture(scope="module")
def campaign_run(tmp_path_factory) -> Campaign:
    """Data stage, then the campaign interrupted during stage 2, then the same command again to the end."""
    workdir = tmp_path_factory.mktemp("campaign")
    config = write_config(workdir / "config.yaml", campaign_config())
    log = interrupt_during_stage2(workdir, config)
    root = workdir / "results/campaign"
    unfinished = [r for r in STAGE2_RUNS if not (root / "stage2" / r / "result.json").exists()]
    assert unfinished, "the campaign finished before it could be interrupted:\n" + log[-3000:]
    stage1 = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.glob("stage1/*/*") if p.is_file()}
    assert len([p for p in stage1 if p.name == "result.json"]) == 6, log[-3000:]
    lines = {}
    for run in unfinished:
        metrics = root / "stage2" / run / "metrics.jsonl"
        lines[run] = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    ok(snakemake(workdir, config, "--cores", "2", "campaign", timeout=400))
    return Campaign(workdir, config, unfinished, stage1, lines)


def test_tiny_campaign_end_to_end(campaign_run: Campaign) -> None:
    root = campaign_run.workdir / "results/campaign"
    plan = json.loads((root / "campaign.json").read_text())
    assert [len(s["runs"]) for s in plan["stages"]] == [6, 4, 2]
    estimate = plan["gpu_hour_estimate"]
    assert estimate["stages"][0]["runs"] == 6 and estimate["total_gpu_hours"] > 0
    ranked = rankings(campaign_run.workdir)
    assert [len(v) for v in ranked.values()] == [6, 4, 2]
    for rows in ranked.values():
        losses = [loss for _, loss in rows]
        assert losses == sorted(losses) and all(0 < x < 10 for x in losses)
    # stage 2 promotes stage 1's best two, each with its whole optimizer block
    best = json.loads((root / "stage1/ranking.json").read_text())[:2]
    for rank, parent in enumerate(best):
        child = yaml.safe_load((root / f"stage2/t-m-parent{rank}-beta2-0.99/resolved.yaml").read_text())
        assert (child["optimizer"]["lr"], child["optimizer"]["weight_decay"]) == (
            parent["lr"],
            parent["weight_decay"],
        )
        assert child["optimizer"]["beta2"] == 0.99 and child["model"]["num_layers"] == 3
        assert child["training"]["batch_tokens"] == 512
    # the report: table rows match comparison.json, one selected recipe per size
    rows = json.loads((root / "report/comparison.json").read_text())
    assert len(rows) == 12 and {r["preset"] for r in rows} == {"t-s", "t-m", "t-l"}
    table = [line for line in (root / "report/report.md").read_text().splitlines() if line.startswith("| t-")]
    assert [line.split("|")[1].strip() for line in table] == [r["run"] for r in rows]
    assert [r["run"] for r in rows[-2:]] == [run for run, _ in ranked["stage3"]]
    selected = (root / "report/selected-t-l.yaml").read_text()
    assert f"# trained in results/campaign/stage3/{ranked['stage3'][0][0]}\n" in selected
    assert yaml.safe_load(selected)["model"]["num_layers"] == 4
    assert (root / "report/learning-curves.png").stat().st_size > 5000


def test_interrupted_runs_resumed_and_nothing_finished_was_retrained(campaign_run: Campaign) -> None:
    root = campaign_run.workdir / "results/campaign"
    for path, (mtime, content) in campaign_run.stage1_files.items():
        assert path.stat().st_mtime_ns == mtime and path.read_bytes() == content, path
    resumed = 0
    for run, count in campaign_run.lines_at_interrupt.items():
        rows = [
            json.loads(line) for line in (root / "stage2" / run / "metrics.jsonl").read_text().splitlines()
        ]
        first_old = next((r["step"] for r in rows[:count] if r.get("event") == "train"), None)
        new_train = [r for r in rows[count:] if r.get("event") == "train"]
        if first_old is not None:
            assert new_train and new_train[0]["step"] > first_old, f"{run} restarted instead of resuming"
            resumed += 1
    assert resumed >= 1


def test_resumed_run_equals_an_uninterrupted_run(campaign_run: Campaign, tmp_path: Path) -> None:
    """Hence the interrupted campaign ranks exactly as an uninterrupted one (no other run was touched)."""
    run = next(r for r, n in campaign_run.lines_at_interrupt.items() if n)
    root = campaign_run.workdir / "results/campaign"
    recipe = root / "stage2" / run / "recipe.yaml"
    fresh = tmp_path / "fresh"
    cmd = [sys.executable, "-m", "tiny_llm", "train", "--config", str(recipe), "--quiet"]
    cmd += ["--set", f"runtime.output_dir={fresh}", "--set", "runtime.cpu_threads=1"]
    subprocess.run(cmd, cwd=campaign_run.workdir, check=True, timeout=120, capture_output=True)
    resumed = json.loads((root / "stage2" / run / "result.json").read_text())
    uninterrupted = json.loads((fresh / "result.json").read_text())
    assert resumed["final_validation"]["loss"] == uninterrupted["final_validation"]["loss"]
    assert resumed["recipe_identity"] == uninterrupted["recipe_identity"]


def test_rerun_does_nothing_and_changed_settings_are_rejected(campaign_run: Campaign) -> None:
    workdir = campaign_run.workdir
    assert "Nothing to be done" in ok(snakemake(workdir, campaign_run.config, "-n", "campaign"))
    changed = campaign_config()
    changed["campaign"]["overrides"]["optimizer"] = {"min_lr_ratio": 0.2}
    proc = snakemake(workdir, write_config(workdir / "changed.yaml", changed), "-n", "campaign")
    assert proc.returncode != 0
    assert "campaign settings changed; use a new output directory" in proc.stdout + proc.stderr
    assert "min_lr_ratio" in proc.stdout + proc.stderr
    # execution-only settings (the checkpoint interval) are the same campaign and retrain nothing
    same = campaign_config()
    same["recipe_defaults"]["training"]["checkpoint_every"] = 3
    out = ok(snakemake(workdir, write_config(workdir / "same.yaml", same), "-n", "campaign"))
    assert "train_campaign" not in out
