"""Static checks of the workflow: lint, dry runs of the full DAGs, config validation. No job runs here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from workflow_helpers import DEMO_STAGES, REPO, SNAKEFILE, WITHOUT_TORCH, snakemake, tiny_config, write_config


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    table = output.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def provided_resources(log: str) -> list[str]:
    """Snakemake's announcement of the global resources a run provides (none: no line)."""
    return [line for line in log.splitlines() if line.startswith("Provided resources")]


@pytest.mark.slow  # also a static check of .ci/run
def test_lint_is_clean(tmp_path: Path) -> None:
    proc = snakemake(tmp_path, REPO / "workflow_config.yaml", "--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


def test_default_target_is_the_embedded_demo(demo_dry_run: subprocess.CompletedProcess) -> None:
    """Shipped config: corpus -> tokenizer -> cache -> every demo run, evaluated and plotted."""
    proc = demo_dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    demo_runs = len(_load_yaml(REPO / "workflow_config.yaml")["runs"])
    assert counts["build_corpus"] == counts["train_tokenizer"] == counts["prepare_cache"] == 1
    assert counts["train_run"] >= demo_runs and counts["evaluate_run"] == demo_runs
    assert counts["plot_curves"] == 1 and counts["all"] == 1
    assert "python -m tiny_llm build-demo-corpus" in proc.stdout


@pytest.mark.slow
def test_cluster_config_streams_c4_without_building_a_corpus(
    tmp_path: Path, cluster_dry_run: subprocess.CompletedProcess
) -> None:
    proc = cluster_dry_run  # runs, data and the GH200 tuning
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    assert "build_corpus" not in counts and "train_tokenizer" not in counts
    assert counts["prepare_cache"] == 1
    assert "python -m tiny_llm prepare --config results/data/prepare.yaml" in proc.stdout
    # The 20m run needs the GPU resource; the training rules carry it, the run says how many there are.
    assert re.search(r"rule train_run:(.|\n)*?resources:.*gpu=1", proc.stdout)
    # the cache's recipe (a plain file, written without torch) streams the pinned C4 revision
    proc = snakemake(tmp_path, REPO / "config" / "cluster.yaml", "--cores", "1", "results/data/prepare.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # a local run of a GPU configuration runs one GPU job at a time when not told how many GPUs there are
    (announced,) = provided_resources(proc.stderr)
    assert re.search(r"gpu\W+1\b", announced), announced
    recipe = _load_yaml(tmp_path / "results/data/prepare.yaml")
    assert recipe["data"]["dataset"] == "allenai/c4"
    assert recipe["data"]["dataset_revision"] == "1588ec454efa1a09f29cd18ddd04fe05fc8653a2"


@pytest.mark.slow  # two real runs (the default of one GPU job at a time: the test above, fast tier)
def test_only_a_gpu_configuration_announces_gpus(tmp_path: Path) -> None:
    """The CPU demo mentions no GPU at all; `--resources gpu=N` sets how many GPU jobs a local run runs at
    once (one without it: test_cluster_config_streams_c4_without_building_a_corpus)."""
    target = ("--cores", "1", "results/data/prepare.yaml")
    (tmp_path / "demo").mkdir()
    (tmp_path / "cluster").mkdir()
    demo = snakemake(tmp_path / "demo", REPO / "workflow_config.yaml", *target)
    cluster_config = REPO / "config" / "cluster.yaml"
    cluster = snakemake(tmp_path / "cluster", cluster_config, *target, "--resources", "gpu=4")
    for proc in (demo, cluster):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert provided_resources(demo.stderr) == [] and "gpu" not in demo.stderr.split("Job stats", 1)[0]
    (announced,) = provided_resources(cluster.stderr)
    assert re.search(r"gpu\W+4\b", announced), announced


def test_dry_run_never_imports_torch(demo_dry_run: subprocess.CompletedProcess) -> None:
    """Parsing and planning stay torch-free (fast on a login node and in CI): the default target's dry run
    is made by a controller in which importing torch fails."""
    assert demo_dry_run.args[1:3] == ["-c", WITHOUT_TORCH]
    assert demo_dry_run.returncode == 0, demo_dry_run.stdout + demo_dry_run.stderr
    assert "train_run" in job_counts(demo_dry_run.stdout)


def test_schema_rejects_a_typo_with_one_clear_line(tmp_path: Path) -> None:
    config = tiny_config()
    config["runz"] = config.pop("runs")
    config["data"]["cach_dir"] = "x"
    proc = snakemake(tmp_path, write_config(tmp_path / "typo.yaml", config), "-n")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "(top level): unknown key 'runz' (did you mean 'runs'?)" in text
    assert "data: unknown key 'cach_dir' (did you mean 'cache_dir'?)" in text
    assert "typo.yaml" in text


# The messages are tests/unit/test_pipeline.py's (in-process, the same build_plan the Snakefile calls), and
# test_schema_rejects_a_typo_with_one_clear_line shows that the Snakefile stops with them: full suite only.
@pytest.mark.slow
def test_schema_rejects_wrong_types_and_unknown_sizes(tmp_path: Path) -> None:
    config = tiny_config(bad={"size": "huge"})
    config["sizes"]["tiny"]["threads"] = "four"
    proc = snakemake(tmp_path, write_config(tmp_path / "bad.yaml", config), "-n")
    assert proc.returncode != 0
    assert "sizes.tiny.threads: 'four' is not of type 'integer'" in proc.stdout + proc.stderr

    config = tiny_config(bad={"size": "huge"})
    proc = snakemake(tmp_path, write_config(tmp_path / "size.yaml", config), "-n")
    assert proc.returncode != 0
    assert "runs.bad.size: unknown size 'huge'; sizes: tiny" in proc.stdout + proc.stderr


@pytest.mark.slow  # in-process: tests/unit/test_pipeline.py::test_bad_stage_settings_name_the_key
def test_recipe_overrides_are_validated_when_the_workflow_is_parsed(tmp_path: Path) -> None:
    config = tiny_config(a={"size": "tiny", "overrides": {"optimizer": {"lrr": 0.1}}})
    proc = snakemake(tmp_path, write_config(tmp_path / "recipe.yaml", config), "-n")
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "runs.a: invalid recipe: optimizer.lrr: unknown key (did you mean 'lr'?)" in text


def _load_yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", setup, re.DOTALL)
    commands = [line for block in blocks for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo.startswith("pip install torch==2.13.0 && ") and demo.endswith("&& python -m snakemake")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines()
    assert "set -euo pipefail" in ci


def test_export_stage_dry_runs_one_job_per_run_and_campaign_size(
    demo_stages_dry_run: subprocess.CompletedProcess,
) -> None:
    proc = demo_stages_dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    config = _load_yaml(REPO / "workflow_config.yaml")
    sizes = {stage["size"] for stage in config["campaign"]["stages"]}
    assert counts["export_run"] == len(config["runs"]) and counts["export_best"] == len(sizes)
    assert counts["report_exports"] == 1
    assert "--best-of results/campaign/stage3/ranking.json" in proc.stdout


@pytest.mark.slow  # in-process: test_campaign.py::test_the_reference_72_run_sweep_is_a_workflow_config
def test_the_reference_72_run_sweep_dry_runs_to_72_training_jobs(tmp_path: Path) -> None:
    """config/sweep-20m.yaml: 8 LR x 3 beta2 x 3 seeds; the plan job's message gives the GPU-hour estimate."""
    proc = snakemake(tmp_path, REPO / "config" / "sweep-20m.yaml", "-n", "campaign")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["train_campaign"] == 72 and counts["plan_campaign"] == 1 and counts["rank_stage"] == 1
    assert "select_run" not in counts and "bench_candidate" not in counts
    assert "stage1: 72 (24 configurations x 3 seeds) x 20m x 408,071,168 tokens -> 4.988 GPU-h" in proc.stdout
    assert "results/sweep-20m/stage1/20m-lr0.0056-wd0.1-beta2-0.98-s43/result.json" in proc.stdout


@pytest.mark.slow  # in-process: test_campaign.py::test_the_optimizer_study_estimates_12_runs
def test_the_optimizer_study_dry_runs_to_12_training_jobs(tmp_path: Path) -> None:
    """config/optimizers-20m.yaml: AdamW and Muon at three muon.lr, 3 seeds each, from one campaign plan."""
    proc = snakemake(tmp_path, REPO / "config" / "optimizers-20m.yaml", "-n", "campaign")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["train_campaign"] == 12 and counts["plan_campaign"] == 1 and counts["rank_stage"] == 1
    assert "stage1: 12 (4 configurations x 3 seeds) x 20m x 408,071,168 tokens -> 0.831 GPU-h" in proc.stdout
    for run in ("20m-lr0.0056-s42", "20m-lr0.0056-muon-mlr0.0112-s44"):
        assert f"results/optimizers-20m/stage1/{run}/result.json" in proc.stdout


def test_demo_campaign_trains_every_configuration_with_two_seeds(
    demo_stages_dry_run: subprocess.CompletedProcess,
) -> None:
    """The shipped demo: 6 -> 4 -> 2 configurations x 2 seeds (its losses and time: benchmarks/README.md)."""
    proc = demo_stages_dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert job_counts(proc.stdout)["train_campaign"] == 24
    assert "stage1: 12 (6 configurations x 2 seeds) x demo-s" in proc.stdout
    assert "stage3: 4 (2 configurations x 2 seeds) x demo-l" in proc.stdout
    assert "results/campaign/stage2/demo-m-parent1-beta2-0.99-s43/result.json" in proc.stdout


def test_analysis_stage_dry_runs_one_job_per_epoch_and_case(
    demo_stages_dry_run: subprocess.CompletedProcess,
) -> None:
    proc = demo_stages_dry_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["analyze_checkpoint"] >= 4 and counts["analyze_checkpoint"] % 2 == 0
    assert counts["summarize_analysis"] == 1
    command = "python -m tiny_llm analyze --run results/runs/demo-s --checkpoint epoch-001 --case seen"
    assert command in proc.stdout


def test_timed_jobs_take_every_core_so_nothing_runs_beside_them(
    demo_stages_dry_run: subprocess.CompletedProcess,
) -> None:
    """Locally a tuning candidate or packed benchmark asks for all cores: the scheduler starts nothing beside
    it, while a training job asks for its size's threads."""
    proc = demo_stages_dry_run
    assert {"tuning", "packed", "runs"} <= set(DEMO_STAGES)
    assert proc.args[proc.args.index("--cores") + 1] == "2"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blocks = proc.stdout.split("\n\n")
    timed = [b for b in blocks if "rule bench_candidate:" in b or "rule bench_packed:" in b]
    training = [b for b in blocks if "rule train_run:" in b]
    assert timed and training
    assert all(re.search(r"^\s+threads: 2$", b, re.MULTILINE) for b in timed)
    assert not any(re.search(r"^\s+threads: 2$", b, re.MULTILINE) for b in training)  # 1 is not printed


def test_stages_are_switched_off_by_their_targets_only() -> None:
    """Every rule is always defined (none inside an `if`, none disabled by an impossible wildcard constraint):
    a stage that is off has no targets, so nothing asks for its rules."""
    for path in [SNAKEFILE, *sorted((REPO / "rules").glob("*.smk"))]:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^[ \t]+(rule|checkpoint) \w+:", text, re.MULTILINE), path.name
        assert "(?!)" not in text, path.name
    for path in sorted((REPO / "tiny_llm" / "pipeline").glob("*.py")):
        assert "(?!)" not in path.read_text(encoding="utf-8"), path.name


@pytest.mark.slow
def test_a_config_without_a_campaign_still_defines_its_rules(tmp_path: Path) -> None:
    proc = snakemake(tmp_path, write_config(tmp_path / "tiny.yaml", tiny_config()), "--list-rules")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = set(proc.stdout.split())
    assert {"plan_campaign", "train_campaign", "select_run", "rank_stage", "report_campaign"} <= rules
    assert {"export_best", "analyze_checkpoint", "bench_packed"} <= rules
    assert {"train_trunk", "train_branch", "report_horizons"} <= rules
    proc = snakemake(tmp_path, tmp_path / "tiny.yaml", "-n", "campaign")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(job_counts(proc.stdout)) == {"campaign", "total"}  # the target alone: no campaign job


@pytest.mark.slow
def test_the_reference_wsd_horizon_study_dry_runs_to_3_trunks_and_15_branches(tmp_path: Path) -> None:
    """config/wsd-horizons-20m.yaml: 5 horizons x 3 seeds; a trunk per seed, stopped at 160's decay start."""
    proc = snakemake(tmp_path, REPO / "config" / "wsd-horizons-20m.yaml", "-n", "horizons")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["train_trunk"] == 3 and counts["train_branch"] == 15 and counts["report_horizons"] == 1
    assert "--stop-at-step 22464 --keep-state-at 2808 5615 11231 16848" in proc.stdout
    assert "--from-state results/horizons/seed43/trunk/step-0011231.pt" in proc.stdout
    # the report takes every branch directory as an argument of its own (each quoted alone)
    report = next(line for line in proc.stdout.splitlines() if "horizons-report" in line)
    runs = report.split("--runs ", 1)[1].split(" --output-dir", 1)[0].split(" ")
    assert len(runs) == 15 and all(re.fullmatch(r"results/horizons/seed4[234]/h[0-9]+", run) for run in runs)


# Each sweep's estimate is also checked in-process (tests/unit/test_campaign.py); one dry run is fast tier.
@pytest.mark.parametrize(
    ("name", "runs", "gpu_hours"),
    [
        pytest.param("packed8-awc", 240, 29.720, marks=pytest.mark.slow),
        pytest.param("packed4-awc", 135, 16.718, marks=pytest.mark.slow),
        ("packed4-atc", 72, 8.916),
    ],
)
def test_packed_sweeps_dry_run_to_their_jobs_and_estimate_gpu_hours(
    tmp_path: Path, name: str, runs: int, gpu_hours: float
) -> None:
    config = REPO / "config" / f"sweep-{name}.yaml"
    proc = snakemake(tmp_path, config, "-n", "campaign")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert job_counts(proc.stdout)["train_campaign"] == runs
    assert f"stage1: {runs} ({runs // 3} configurations x 3 seeds)" in proc.stdout
    assert f"-> {gpu_hours:.3f} GPU-h" in proc.stdout
