"""Throughput-map points: an out-of-memory outside the caching allocator is an out-of-memory, a point's
timeout grows with its work and a timeout is recorded as one, each line says what stopped it, and a point
never touches files beside its record that it did not write."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import plan_of, tiny

from tiny_llm.bench import worker
from tiny_llm.bench.worker import WorkerOptions, run_worker
from tiny_llm.config import dump_recipe, load_recipe
from tiny_llm.errors import ConfigError
from tiny_llm.output_dirs import OUTPUT_MARKER
from tiny_llm.tuning import throughput_map, tuner
from tiny_llm.tuning.throughput_map import frontier, point_timeout, run_point, summarize, table

QUICK = WorkerOptions(data_mode="synthetic", warmup=1, steps=1, windows=1)
PROTOCOL: dict[str, Any] = {
    "data_mode": "synthetic",
    "warmup": 20,
    "steps": 100,
    "windows": 3,
    "max_windows": 6,
    "max_spread": 0.05,
    "timeout_seconds": 600,
    "timeout_flops_per_second": 1e14,
}


class InductorError(RuntimeError):
    """A compiler's error around the kernel's own, as Inductor raises it."""


def triton_load_failure() -> Exception:
    try:
        raise RuntimeError("Triton Error [CUDA]: out of memory")
    except RuntimeError as exc:
        wrapped = InductorError("backend compiler failed: could not load the compiled module")
        wrapped.__cause__ = exc
        return wrapped


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported"),
            "CUDA error: out of memory",
        ),
        (
            RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
            "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        ),
        (triton_load_failure(), "Triton Error [CUDA]: out of memory"),
    ],
    ids=["cuda-call", "cublas", "triton-module-load"],
)
def test_an_out_of_memory_outside_the_caching_allocator_is_an_out_of_memory(
    monkeypatch: pytest.MonkeyPatch, error: Exception, line: str
) -> None:
    def failing(*args: object) -> None:
        raise error

    monkeypatch.setattr(worker, "build_engine", failing)
    out = run_worker(load_recipe(["tiny"], ["runtime.cpu_threads=1"]), QUICK)
    assert (out["status"], out["error"]) == ("memory_limit", f"out of memory: {line}")
    statuses = {(1, "first"): "ok", (2, "first"): out["status"], (2, "confirm"): out["status"]}
    walk = list(frontier(lambda micro, trial: {"status": statuses[(micro, trial)]}, 64))
    assert walk[-1] == (2, "confirm")  # the line keeps its confirmation point


def test_another_kernel_failure_stays_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*args: object) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(worker, "build_engine", failing)
    out = run_worker(load_recipe(["tiny"], ["runtime.cpu_threads=1"]), QUICK)
    assert out["status"] == "failed" and out["error"].startswith("RuntimeError: CUDA error: an illegal")


def test_a_points_timeout_grows_with_its_work() -> None:
    model = load_recipe(["500m"]).model
    small, large = (
        point_timeout(PROTOCOL, model, context, micro) for context, micro in ((512, 1), (4096, 64))
    )
    assert 600 < small < 700  # a small point: start-up and compilation
    # 621 updates of 64 x 4,096 tokens at about 3.9 GFLOP a token: nearly two hours at a tenth of an H200's
    # peak, where the fixed 600 s cut the line off before its out-of-memory
    assert large > 6000
    assert large - 600 == pytest.approx(2 * (point_timeout(PROTOCOL, model, 4096, 32) - 600))
    config = tiny(throughput={"sizes": ["tiny"], "contexts": [32], "timeout_seconds": 600})
    config["sizes"]["tiny"]["preset"] = "500m"
    plan = plan_of(config)
    wildcards = type("W", (), {"size": "tiny", "context": "4096", "micro": "64"})()
    assert plan.throughput.resources(wildcards).runtime_minutes == int(large // 60) + 10


def point_files(tmp_path: Path) -> tuple[Path, Path]:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(dump_recipe(load_recipe(["tiny"])), encoding="utf-8")
    return recipe, tmp_path / "ctx32" / "m4-first.json"


def test_a_timeout_is_recorded_as_one_with_its_scaled_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, output = point_files(tmp_path)
    limits: list[float] = []

    def timing_out(cmd: list[str], log: Path, timeout: float) -> tuple[int, bool]:
        limits.append(timeout)
        return -15, True

    monkeypatch.setattr(tuner, "run_process_group", timing_out)
    record = run_point(recipe, 32, 4, output, PROTOCOL)
    expected = point_timeout(PROTOCOL, load_recipe(["tiny"]).model, 32, 4)
    assert limits == [expected] and record["timeout_seconds"] == round(expected, 1)
    assert (record["status"], record["error"]) == ("timeout", f"killed after its {expected:,.0f} s timeout")
    assert json.loads(output.read_text()) == record


def line_of(*points: tuple[int, str, str, str | None]) -> list[dict[str, Any]]:
    return [
        {"size": "tiny", "context": 32, "micro_batch_size": m, "trial": t, "status": s, "error": e}
        | ({"tokens_per_second": 100.0 * m} if s == "ok" else {})
        for m, t, s, e in points
    ]


def test_the_table_says_what_stopped_each_line_and_the_console_names_each_failed_point() -> None:
    ok = (1, "first", "ok", None)
    lines = {
        16: line_of(ok, (2, "first", "ok", None)),
        32: line_of(ok, (2, "first", "memory_limit", "out of memory"), (2, "confirm", "memory_limit", "oom")),
        64: line_of(ok, (2, "first", "failed", "RuntimeError: CUDA error: an illegal memory access\nmore")),
        128: line_of(ok, (2, "first", "timeout", "killed after its 1,234 s timeout")),
    }
    points = [p | {"context": context} for context, line in lines.items() for p in line]
    summary = summarize(points, {"tiny": 1000})
    stopped = {row["context"]: row["stopped_by"] for row in summary["lines"]}
    assert stopped == {
        16: "ok",
        32: "out of memory twice",
        64: "failed: RuntimeError: CUDA error: an illegal memory access",
        128: "timeout (killed after its 1,234 s timeout)",
    }
    rows = table(summary).splitlines()
    assert rows[0].endswith("| stopped by |") and rows[4].endswith(
        "| failed: RuntimeError: CUDA error: an illegal memory access |"
    )
    unmeasured = throughput_map.unmeasured_points(summary, lambda s, c, m, t: f"{s}/ctx{c}/m{m}-{t}.json")
    assert unmeasured == [
        "  tiny/ctx64/m2-first.json: failed: RuntimeError: CUDA error: an illegal memory access",
        "  tiny/ctx128/m2-first.json: timeout (killed after its 1,234 s timeout)",
    ]


def test_the_plan_prints_the_unmeasured_points_of_its_last_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = plan_of(tiny(throughput={"sizes": ["tiny"], "contexts": [32]}))
    assert plan.throughput.unmeasured_lines() == []  # no report yet
    summary = summarize(line_of((1, "first", "failed", "ValueError: bad kernel")), {"tiny": 1000})
    Path("results/throughput").mkdir(parents=True)
    Path("results/throughput/summary.json").write_text(json.dumps(summary))
    assert plan.throughput.unmeasured_lines() == [
        "Throughput map: 1 point(s) measured nothing; to measure one again, run the throughput target again "
        "with --forcerun <its record>:",
        "  results/throughput/tiny/ctx32/m1-first.json: failed: ValueError: bad kernel",
    ]


def fake_worker(cmd: list[str], log: Path, timeout: float) -> tuple[int, bool]:
    """The worker process's two files, as it writes them: its log, and its record at --output."""
    log.write_text("worker log\n")
    record = {
        "status": "ok",
        "error": None,
        "tokens_per_second": 10.0,
        "measurements": [{"tokens_per_second": 10.0}],
    }
    Path(cmd[cmd.index("--output") + 1]).write_text(json.dumps(record))
    return 0, False


def test_a_point_leaves_a_users_files_beside_its_record_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, output = point_files(tmp_path)
    output.parent.mkdir()
    mine = {output.with_suffix(".log"): "my notes\n", output.with_suffix(".worker.json"): '{"mine": true}'}
    for path, text in mine.items():
        path.write_text(text)
    monkeypatch.setattr(tuner, "run_process_group", fake_worker)
    assert run_point(recipe, 32, 4, output, PROTOCOL)["status"] == "ok"
    assert all(path.read_text() == text for path, text in mine.items())
    work = output.with_name("m4-first.point")
    assert sorted(p.name for p in work.iterdir()) == [OUTPUT_MARKER, "worker.json", "worker.log"]
    assert run_point(recipe, 32, 4, output, PROTOCOL, "first")["status"] == "ok"  # its own, again


def test_a_folder_of_someone_elses_in_place_of_the_points_work_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, output = point_files(tmp_path)
    work = output.with_name("m4-first.point")
    work.mkdir(parents=True)
    (work / "worker.log").write_text("someone's\n")
    monkeypatch.setattr(tuner, "run_process_group", fake_worker)
    with pytest.raises(ConfigError) as err:
        run_point(recipe, 32, 4, output, PROTOCOL)
    assert str(err.value) == (
        f"--output {output}: {work}, where the point keeps its worker's log and record, is a non-empty "
        "directory that tiny-llm did not write; move it away or choose another --output"
    )
    assert os.listdir(work) == ["worker.log"] and not output.exists()


def test_a_point_is_one_mapping_of_recipe_keys_and_the_worker_gets_it_as_its_sets() -> None:
    from tiny_llm.tuning.throughput_map import point_overrides, point_sets

    assert point_sets(512, 2, 3_000, 121) == [
        "model.context_length=512",
        "training.micro_batch_size=2",
        "training.batch_tokens=1024",
        "training.tokens_per_parameter=41.30133333333333",
        "training.epoch_tokens_per_parameter=41.30133333333333",
    ]
    by_sets = load_recipe(["tiny"], point_sets(64, 4, 7_777, 13))
    assert by_sets == load_recipe(["tiny"], overrides=point_overrides(64, 4, 7_777, 13))
