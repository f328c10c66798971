"""A tiny 4 -> 2 -> 1 campaign with two seeds per configuration (8 -> 4 -> 2 runs) end to end on the CPU:
interrupted (Ctrl-C) during stage 2 and rerun to the end, then rerun after success and rerun with a changed
setting (rejected)."""

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
from workflow_helpers import snakemake, snakemake_command, snakemake_env, tiny_config, write_config

pytestmark = pytest.mark.slow

SEEDS = (1, 2)
STAGE2_RUNS = [f"t-m-parent{rank}-beta2-0.99-s{seed}" for rank in (0, 1) for seed in SEEDS]


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
            {"size": "t-s", "lr": [1e-3, 3e-3], "weight_decay": [0.0, 0.1], "seeds": list(SEEDS)},
            {"size": "t-m", "parents": 2, "beta2": [0.99]},  # each configuration keeps both seeds
            {"size": "t-l", "parents": 1},
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
    """Stage -> (configuration, mean loss over its seeds), best first."""
    out = {}
    for stage in ("stage1", "stage2", "stage3"):
        rows = json.loads((root / "results/campaign" / stage / "ranking.json").read_text())
        out[stage] = [(r["configuration"], r["loss"]) for r in rows]
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
    env = snakemake_env()
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
    assert len([p for p in stage1 if p.name == "result.json"]) == 8, log[-3000:]
    lines = {}
    for run in unfinished:
        metrics = root / "stage2" / run / "metrics.jsonl"
        lines[run] = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    ok(snakemake(workdir, config, "--cores", "2", "campaign", timeout=400))
    return Campaign(workdir, config, unfinished, stage1, lines)


def test_tiny_campaign_end_to_end(campaign_run: Campaign) -> None:
    root = campaign_run.workdir / "results/campaign"
    plan = json.loads((root / "campaign.json").read_text())
    assert [len(s["runs"]) for s in plan["stages"]] == [8, 4, 2]
    assert [len(s["configurations"]) for s in plan["stages"]] == [4, 2, 1]
    estimate = plan["gpu_hour_estimate"]
    assert estimate["stages"][0]["runs"] == 8 and estimate["total_gpu_hours"] > 0
    ranked = rankings(campaign_run.workdir)
    assert [len(v) for v in ranked.values()] == [4, 2, 1]
    for rows in ranked.values():
        losses = [loss for _, loss in rows]
        assert losses == sorted(losses) and all(0 < x < 10 for x in losses)
    # stage 2 promotes stage 1's best two configurations, each with its whole optimizer block and both seeds
    best = json.loads((root / "stage1/ranking.json").read_text())[:2]
    for rank, parent in enumerate(best):
        assert parent["n"] == 2 and parent["loss_sd"] is not None
        for seed in SEEDS:
            child = yaml.safe_load(
                (root / f"stage2/t-m-parent{rank}-beta2-0.99-s{seed}/resolved.yaml").read_text()
            )
            assert (child["optimizer"]["lr"], child["optimizer"]["weight_decay"]) == (
                parent["lr"],
                parent["weight_decay"],
            )
            assert child["optimizer"]["beta2"] == 0.99 and child["model"]["num_layers"] == 3
            assert child["training"]["batch_tokens"] == 512 and child["runtime"]["seed"] == seed
    # seeds differ: the two runs of a configuration do not end at the same loss
    stage1 = json.loads((root / "stage1/ranking.json").read_text())
    assert all(len(set(r["run_losses"])) == 2 for r in stage1)
    # the report: run rows match comparison.json, one aggregate row per configuration, mean ± SD in the table
    rows = json.loads((root / "report/comparison.json").read_text())
    runs = [r for r in rows if r["kind"] == "run"]
    configurations = [r for r in rows if r["kind"] == "configuration"]
    assert len(runs) == 14 and {r["preset"] for r in runs} == {"t-s", "t-m", "t-l"}
    assert len(configurations) == 7 and all(c["n"] == 2 for c in configurations)
    report_md = (root / "report/report.md").read_text()
    config_table, run_table = report_md.split("## Runs", 1)
    table = [line for line in run_table.splitlines() if line.startswith("| t-")]
    assert [line.split("|")[1].strip() for line in table] == [r["run"] for r in runs]
    means = [line for line in config_table.splitlines() if line.startswith("| t-")]
    assert len(means) == 7 and all(" ± " in line for line in means)
    assert [r["run"] for r in runs[-2:]] == [f"{ranked['stage3'][0][0]}-s{seed}" for seed in SEEDS]
    selected = (root / "report/selected-t-l.yaml").read_text()
    assert f"# trained in results/campaign/stage3/{ranked['stage3'][0][0]}-s1\n" in selected
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
    assert (
        "campaign.output_dir: campaign settings changed; use a new output directory"
        in proc.stdout + proc.stderr
    )
    assert "min_lr_ratio" in proc.stdout + proc.stderr
    # execution-only settings (the checkpoint interval) are the same campaign: its recipes are rewritten and
    # its runs only re-finalise (tests/workflow/test_safety_workflow.py), and the token cache is left alone
    same = campaign_config()
    same["recipe_defaults"]["training"]["checkpoint_every"] = 3
    out = ok(snakemake(workdir, write_config(workdir / "same.yaml", same), "-n", "campaign"))
    assert "prepare_cache" not in out
