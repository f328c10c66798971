"""benchmarks/gpu_check.sh and gpu_check.py: the default steps' order and budgets (--dry-run), the parsing of
their outputs, and (slow) the whole check at tiny settings on the CPU (--cpu-smoke)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
LIMIT = 540
# Least known first: environment, CUDA tests, a real 20m train (its data first), CUDA graph, Muon, the map's
# point pair, workflow rehearsal, the benchmarks, the peers.
DEFAULT_ORDER = [
    "env",
    "pytest-cuda",
    "data",
    "train-20m",
    "cuda-graph-20m",
    "muon",
    "map-points",
    "workflow",
    "bench-20m",
    "bench-90m",
    "peers",
]
STEP_LINE = re.compile(r"^# step (\S+) \(budget (\d+) s\)")
SUM_LINE = re.compile(r"^# budget sum: install (\d+) s \+ steps (\d+) s = (\d+) s, (within|OVER) the (\d+) s")


def load_gpu_check():
    if str(REPO / "benchmarks") not in sys.path:  # its runner and the reference figures are its siblings
        sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def dry_run(tmp_path: Path, *args: str) -> str:
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dry_run_lists_the_steps_least_known_first_within_540_s(tmp_path):
    out = dry_run(tmp_path)
    steps = [(m[1], int(m[2])) for m in map(STEP_LINE.match, out.splitlines()) if m]
    assert [name for name, _ in steps] == DEFAULT_ORDER
    assert all(budget > 0 for _, budget in steps)
    [total] = [m for m in map(SUM_LINE.match, out.splitlines()) if m]
    install, steps_sum, grand, verdict, limit = (
        int(total[1]),
        int(total[2]),
        int(total[3]),
        total[4],
        int(total[5]),
    )
    assert steps_sum == sum(budget for _, budget in steps)
    assert grand == install + steps_sum <= LIMIT == limit
    assert verdict == "within"
    # the install's commands are printed with their timeouts, and those add up to its budget
    timeouts = [int(t) for t in re.findall(r"^timeout (\d+) ", out.split("# mode ")[0], re.MULTILINE)]
    assert sum(timeouts) == install > 0
    # every command of a step has a timeout, and they add up to the step's budget
    blocks = re.split(r"^# step ", out.split("# budgets")[0], flags=re.MULTILINE)[1:]
    for (name, budget), block in zip(steps, blocks, strict=True):
        assert sum(int(t) for t in re.findall(r"^timeout (\d+) ", block, re.MULTILINE)) == budget, name


def test_only_selects_steps_outside_the_default_list(tmp_path):
    out = dry_run(tmp_path, "--only", "kernel-flash,compile-mode,cuda-graph-20m")
    names = [m[1] for m in map(STEP_LINE.match, out.splitlines()) if m]
    # the graph's correctness (pytest-cuda) and its figure without the graph (bench-20m) come along; the
    # compile-mode trains need the data step
    assert names == ["pytest-cuda", "data", "cuda-graph-20m", "bench-20m", "compile-mode", "kernel-flash"]


def test_unknown_step_is_a_one_line_error(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--only", "no-such-step"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "unknown step(s) ['no-such-step']" in done.stdout


def test_pytest_summary_line_is_parsed(tmp_path):
    gc = load_gpu_check()
    log = tmp_path / "stdout.log"
    log.write_text(
        "..s.F\n- generated xml file: x.xml -\n1 failed, 3 passed, 4 skipped, 618 deselected in 8.6s\n"
    )
    counts, line = gc.pytest_counts(log)
    assert counts == {"failed": 1, "passed": 3, "skipped": 4, "deselected": 618}
    assert line.endswith("in 8.6s")
    log.write_text("==== 2 skipped, 1 error, 3 warnings in 1.20s ====\n")
    assert gc.pytest_counts(log)[0] == {"skipped": 2, "error": 1, "warning": 3}
    log.write_text("no summary\n")
    assert gc.pytest_counts(log) == ({}, None)


def test_pytest_step_status_and_graph_tests(tmp_path):
    gc = load_gpu_check()
    setup = gc.Setup("gpu", tmp_path, tmp_path)
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.unit.test_cuda" name="test_the_captured_update_trains_the_model"/>'
        '<testcase classname="tests.unit.test_cuda" name="test_compiled_eval">'
        '<failure message="x"/></testcase>'
        '<testcase classname="tests.unit.test_cuda" name="test_kernel"><skipped message="y"/></testcase>'
        "</testsuite></testsuites>"
    )
    log = tmp_path / "pytest.log"
    log.write_text("1 failed, 1 passed, 1 skipped, 9 deselected in 3.0s\n")
    record = gc.check_pytest(setup, junit, [{"rc": 1, "stdout_log": str(log)}])
    assert record["status"] == "failed"
    assert record["counts"] == {"failed": 1, "passed": 1, "skipped": 1, "deselected": 9}
    assert record["tests"]["tests.unit.test_cuda::test_compiled_eval"] == "failed"
    setup.records["pytest-cuda"] = record
    graph = gc.graph_correctness(setup)
    assert graph["verdict"] == "passed"
    assert list(graph["tests"]) == ["tests.unit.test_cuda::test_the_captured_update_trains_the_model"]
    # every test skipped: fine on the CPU, a failure on the GPU
    log.write_text("3 skipped, 9 deselected in 1.0s\n")
    assert (
        gc.check_pytest(setup, tmp_path / "none.xml", [{"rc": 0, "stdout_log": str(log)}])["status"]
        == "failed"
    )
    cpu = gc.Setup("cpu-smoke", tmp_path, tmp_path)
    assert gc.check_pytest(cpu, tmp_path / "none.xml", [{"rc": 0, "stdout_log": str(log)}])["status"] == "ok"
    log.write_text("626 deselected in 1.0s\n")
    assert (
        gc.check_pytest(cpu, tmp_path / "none.xml", [{"rc": 5, "stdout_log": str(log)}])["status"]
        == "no_tests"
    )


def test_row_rates_skip_spans_with_an_evaluation():
    gc = load_gpu_check()
    rows = [
        {"event": "train", "step": 20, "tokens": 2000, "training_seconds": 9.0, "tokens_per_second": 222},
        {"event": "train", "step": 40, "tokens": 4000, "training_seconds": 1.0, "tokens_per_second": 2000},
        {"event": "eval", "epoch": 1},
        {"event": "train", "step": 60, "tokens": 6000, "training_seconds": 1.0, "tokens_per_second": 2000},
        {"event": "train", "step": 80, "tokens": 8000, "training_seconds": 1.0, "tokens_per_second": 2000},
    ]
    seen = {20: 100.0, 40: 101.25, 60: 110.0, 80: 111.25}  # the evaluation took ~7.5 s
    rates = gc.row_rates(rows, seen)
    assert rates["row_pairs"] == 2
    assert rates["rows_tokens_per_second"] == pytest.approx(2000)
    assert rates["wall_clock_tokens_per_second"] == pytest.approx(1600)
    assert rates["ratio_rows_to_wall_clock"] == pytest.approx(1.25)


def test_later_figures_are_compared_once_bench_20m_has_run(tmp_path):
    gc = load_gpu_check()
    setup = gc.Setup("gpu", tmp_path, tmp_path)
    setup.records["cuda-graph-20m"] = {"tokens_per_second": 2_000_000, "detail": "graph tests passed"}
    setup.records["train-20m"] = {
        "rows_tokens_per_second": 1_500_000,
        "training_tokens_per_second": 1_400_000,
    }
    assert gc.compare_cuda_graph(setup) == {}  # bench-20m not run (yet)
    setup.records["bench-20m"] = {"tokens_per_second": 1_600_000}
    assert gc.compare_cuda_graph(setup)["speedup_over_no_graph"] == pytest.approx(1.25)
    train = gc.compare_train_20m(setup)
    assert train["ratio_rows_to_bench_20m"] == pytest.approx(0.9375)
    assert train["ratio_training_to_bench_20m"] == pytest.approx(0.875)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_cpu_smoke_runs_every_default_step(tmp_path):
    """The default steps for real at tiny settings on the CPU: every one ends ok (pytest-cuda: its cuda tests
    skip on the CPU), with the figures the GPU run reports."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu-smoke"], capture_output=True, text=True, env=env, timeout=3500
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    records = {r["step"]: r for r in summary["steps"]}
    assert list(records) == DEFAULT_ORDER
    budget = summary["budget"]
    assert budget["sum_s"] == budget["install_s"] + sum(budget["steps_s"].values())
    for name, record in records.items():
        assert (out / f"{name}.json").is_file()
        if name == "pytest-cuda" and not (REPO / "tests" / "unit" / "test_cuda.py").exists():
            assert record["status"] in ("ok", "no_tests"), record
            continue
        assert record["status"] == "ok", (name, record.get("error"), record.get("detail"))
    if records["pytest-cuda"]["status"] == "ok":  # on the CPU the cuda tests skip (those that need a GPU)
        assert (
            records["pytest-cuda"]["counts"].get("skipped", 0)
            + records["pytest-cuda"]["counts"].get("passed", 0)
            > 0
        )
    assert records["cuda-graph-20m"]["correctness"]["source"] == "pytest-cuda"
    train = records["train-20m"]
    assert train["train_rows"] >= 2 and train["ratio_training_to_elapsed"] is not None
    assert train["row_pairs"] >= 1 and train["ratio_rows_to_wall_clock"] > 0
    assert "ratio_training_to_bench_20m" in train  # bench-20m ran later; compared at the end
    steps = [r["step"] for r in records["workflow"]["rehearsal"]]
    assert steps == ["tuning", "interrupt", "rerun"]
    assert set(records["peers"]["peers"]) == {"library", "transformers"}


FAKE_PYTHON = """#!/bin/bash
echo "$@" >> "{log}"
case "$*" in
  *"import torch; print"*) {torch} ;;
  *"import tiny_llm"*) exit {package} ;;
  *) exit 0 ;;
esac
"""


def fake_check(work: Path, torch: str, package: int, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """gpu_check.sh with a stand-in interpreter: what it answers to the probes, and every call it got."""
    work.mkdir()
    log, python = work / "calls.log", work / "python"
    python.write_text(FAKE_PYTHON.format(log=log, torch=torch, package=package))
    python.chmod(0o755)
    env = dict(os.environ, OUT=str(work / "out"))
    command = ["bash", str(SCRIPT), "--python", str(python), *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    return done, log.read_text() if log.exists() else ""


def test_a_torch_that_does_not_import_stops_the_check_and_is_never_installed(tmp_path):
    done, calls = fake_check(tmp_path / "a", 'echo "No module named torch" >&2; exit 1', 0, "--install")
    assert done.returncode == 3
    assert "torch does not import" in done.stdout and "it is never installed" in done.stdout
    assert "pip" not in calls


def test_a_working_torch_is_reported_against_the_pin_and_pip_may_not_replace_it(tmp_path):
    done, calls = fake_check(tmp_path / "a", 'echo "2.11.0+cu130 13.0 True"', 1, "--install", "--only", "env")
    assert "[torch] torch 2.11.0+cu130 (pin 2.13.0: differs from the pin" in done.stdout
    pip = [line for line in calls.splitlines() if line.startswith("-m pip")]
    assert len(pip) == 1 and "install -e .[dev] --constraint" in pip[0]  # the found torch as a constraint
    assert not re.search(r"\btorch==", pip[0])  # never a torch requirement of its own
    done, calls = fake_check(tmp_path / "b", 'echo "2.13.0+cpu None False"', 1, "--only", "env")
    assert (
        done.returncode == 3
        and "torch 2.13.0+cpu here is a CPU-only build; install a CUDA build" in done.stdout
    )
    assert "pip" not in calls  # and no pip without --install either


def test_env_reports_the_torch_it_found_against_the_pin_and_the_ddp_outcome_is_read(tmp_path):
    gc = load_gpu_check()
    setup = gc.Setup("gpu", tmp_path, tmp_path)
    probe = tmp_path / "probe.log"
    probe.write_text(json.dumps({"torch": "2.11.0+cu130", "cuda": "13.0", "cuda_available": True,
                                 "device_name": "NVIDIA H200", "device_count": 1}) + "\n")  # fmt: skip
    record = gc.check_env(setup, [{"rc": 0, "stdout_log": str(probe)}])
    assert record["torch_pin"] == "2.13.0" and record["torch_matches_pin"] is False
    assert "torch 2.11.0+cu130 (pin 2.13.0: differs" in record["detail"]
    name = "tests.unit.test_cuda::test_two_ranks_on_two_gpus_train_through_the_launcher"
    assert gc.ddp_outcome({name: "skipped"}) == "skipped (one GPU)"
    assert gc.ddp_outcome({name: "passed"}) == "passed" and gc.ddp_outcome({}) == "not run"


def test_the_map_points_and_muon_records_are_read(tmp_path):
    gc = load_gpu_check()
    setup = gc.Setup("gpu", tmp_path, tmp_path)
    (tmp_path / "logs").mkdir()
    outputs = {8: tmp_path / "m8.json", 64: tmp_path / "m64.json"}
    outputs[8].write_text(json.dumps({"status": "ok", "tokens_per_second": 1000.0, "peak_memory_bytes": 5}))
    outputs[64].write_text(
        json.dumps({"status": "memory_limit", "error": "out of memory: CUDA out of memory"})
    )
    record = gc.check_map_points(setup, outputs, (8, 64), [{}, {}, {}])
    assert record["status"] == "ok" and record["tokens_per_second"] == 1000.0
    outputs[64].write_text(
        json.dumps({"status": "ok", "tokens_per_second": 10.0})
    )  # no out-of-memory: failed
    assert gc.check_map_points(setup, outputs, (8, 64), [{}, {}, {}])["status"] == "failed"
    run_dir, cost = tmp_path / "muon", tmp_path / "cost.log"
    run_dir.mkdir()
    (run_dir / "status.json").write_text(json.dumps({"status": "complete"}))
    rows = [{"event": "train", "loss": 6.0}, {"event": "train", "loss": 5.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shape = {
        "adamw": {"optimizer_ms": 2.0},
        "muon": {"optimizer_ms": 10.0},
        "muon_over_adamw": {"optimizer_ms": 5.0},
    }
    cost.write_text(json.dumps({"cases": {"20m": shape}}))
    record = gc.check_muon(setup, run_dir, [{}, {"stdout_log": str(cost)}])
    assert record["status"] == "ok" and record["muon_over_adamw_optimizer"] == 5.0
    assert "Muon 10.0 ms vs AdamW 2.0 ms (5.0x)" in record["detail"]


def test_the_reference_figures_are_stated_once_and_the_configs_estimate_with_them():
    """benchmarks/reference.py states the GH200 figures; the check uses them, and the workflow configs that
    estimate GPU hours from them hold the same numbers (YAML cannot import them)."""
    gc = load_gpu_check()
    from reference import REFERENCE_TOKENS_PER_SECOND

    assert gc.REFERENCE_TOKENS_PER_SECOND is REFERENCE_TOKENS_PER_SECOND
    cluster = yaml.safe_load((REPO / "config" / "cluster.yaml").read_text())
    assert cluster["campaign"]["throughput"] == REFERENCE_TOKENS_PER_SECOND
    assert cluster["noise"]["throughput"] == REFERENCE_TOKENS_PER_SECOND["20m"]
    for name in ("optimizers-20m.yaml", "sweep-20m.yaml"):
        config = yaml.safe_load((REPO / "config" / name).read_text())
        assert config["campaign"]["throughput"] == {"20m": REFERENCE_TOKENS_PER_SECOND["20m"]}, name
    numbers = re.compile(r"1,?636,?281|871,?826|508,?930|1_636_281")
    copies = [p.name for p in (REPO / "benchmarks").glob("*.py") if numbers.search(p.read_text())]
    assert copies == ["reference.py"]
