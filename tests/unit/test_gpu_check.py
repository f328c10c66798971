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

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
LIMIT = 540
# Least known first: environment, CUDA tests, a real 20m train (its data first), CUDA graph, workflow
# rehearsal, the benchmarks, the peers.
DEFAULT_ORDER = [
    "env",
    "pytest-cuda",
    "data",
    "train-20m",
    "cuda-graph-20m",
    "workflow",
    "bench-20m",
    "bench-50m",
    "bench-90m",
    "peers",
]
STEP_LINE = re.compile(r"^# step (\S+) \(budget (\d+) s\)")
SUM_LINE = re.compile(r"^# budget sum: install (\d+) s \+ steps (\d+) s = (\d+) s, (within|OVER) the (\d+) s")


def load_gpu_check():
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
