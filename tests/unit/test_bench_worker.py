"""Benchmark worker on the tiny preset: JSON schema, median, kernels, profile trace, MFU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tiny_llm.bench import profiling
from tiny_llm.bench.worker import WorkerOptions, median_window, run_worker, spread_is_wide
from tiny_llm.cli import main
from tiny_llm.config import load_recipe
from tiny_llm.engines import build_engine
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.runtime.device import setup_runtime
from tiny_llm.runtime.mfu import PEAK_FLOPS_ENV, Peak, gpu_peak, mfu, peak_flops

SPEC_KEYS = {
    "status",
    "synthetic",
    "tokens_per_second",
    "seconds_per_step",
    "first_update_seconds",
    "warmup_seconds",
    "peak_memory_bytes",
    "total_memory_bytes",
    "micro_batch_size",
    "compile",
    "compile_mode",
    "sdpa_backend",
    "cpu_threads",
    "attention_kernels",
    "environment",
    "protocol",
    "measurements",
    "config_identity",
    "mfu",
}
TINY = ["runtime.cpu_threads=1", "training.batch_tokens=512", "training.micro_batch_size=4"]
QUICK = WorkerOptions(data_mode="synthetic", warmup=2, steps=1, windows=3)


def test_median_window_picks_the_middle_duration():
    rows = [{"window": i, "seconds": s} for i, s in enumerate([3.0, 1.0, 2.0])]
    assert median_window(rows)["window"] == 2
    rows.append({"window": 3, "seconds": 0.5})
    assert median_window(rows)["window"] == 1  # even count: the lower middle (1.0 of 0.5, 1, 2, 3)


def test_synthetic_run_reports_spec_keys_and_median():
    out = run_worker(load_recipe(["tiny"], TINY), QUICK)
    assert out["status"] == "ok", out["error"]
    assert set(out) >= SPEC_KEYS
    assert out["synthetic"] is True and out["micro_batch_size"] == 4 and out["cpu_threads"] == 1
    assert set(out["protocol"]) >= {"warmup", "steps", "windows", "data_mode", "profile", "cache_identity"}
    assert [m["window"] for m in out["measurements"]] == [0, 1, 2]
    middle = sorted(m["seconds"] for m in out["measurements"])[1]
    assert out["seconds_per_step"] == pytest.approx(middle)
    assert out["tokens_per_second"] == pytest.approx(512 / middle)
    assert all(m["loss"] > 0 and m["grad_norm"] > 0 for m in out["measurements"])
    assert out["first_update_seconds"] > 0 and out["warmup_seconds"] > 0
    assert 0 < out["mfu"] < 1 and out["peak_source"].startswith("measured:float32")
    assert any("scaled_dot_product" in k for k in out["attention_kernels"])
    assert len(out["config_identity"]) == 64 and "hardware" in out["environment"]


@pytest.mark.slow
def test_more_windows_only_while_the_spread_is_wide():
    rows = [{"tokens_per_second": r} for r in (100.0, 104.0, 98.0)]
    assert not spread_is_wide(rows, 0.07) and spread_is_wide(rows, 0.05)  # spread 6 of median 100
    recipe = load_recipe(["tiny"], TINY)
    wide = run_worker(
        recipe,
        WorkerOptions(data_mode="synthetic", warmup=1, steps=1, windows=2, max_windows=4, max_spread=0.0),
    )
    assert wide["status"] == "ok" and [m["window"] for m in wide["measurements"]] == [0, 1, 2, 3]
    assert wide["protocol"]["max_windows"] == 4
    calm = run_worker(
        recipe,
        WorkerOptions(data_mode="synthetic", warmup=1, steps=1, windows=2, max_windows=4, max_spread=1e9),
    )
    assert len(calm["measurements"]) == 2  # no spread is wider than a billion medians
    with pytest.raises(ConfigError, match="--max-windows: 0 or at least --windows"):
        run_worker(recipe, WorkerOptions(data_mode="synthetic", windows=3, max_windows=2))


def test_forced_kernels_dispatch_or_fail_clearly():
    math_run = run_worker(load_recipe(["tiny"], [*TINY, "runtime.sdpa_backend=math"]), QUICK)
    assert math_run["status"] == "ok"
    assert any("math" in k for k in math_run["attention_kernels"])
    assert not any("flash" in k for k in math_run["attention_kernels"])
    for kernel in ("flash", "cudnn"):
        gpu_only = run_worker(load_recipe(["tiny"], [*TINY, f"runtime.sdpa_backend={kernel}"]), QUICK)
        assert gpu_only["status"] == "failed" and gpu_only["tokens_per_second"] is None
        assert f"runtime.sdpa_backend: '{kernel}'" in gpu_only["error"] and "CPU" in gpu_only["error"]


def test_gpu_name_requirement_refuses_other_hardware():
    with pytest.raises(ConfigError, match="expects a GPU whose name contains 'GH200'"):
        run_worker(
            load_recipe(["tiny"], TINY), WorkerOptions(data_mode="synthetic", require_gpu_name="GH200")
        )


def test_profile_cli_writes_trace_with_regions(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "bench.json"
    args = ["benchmark-worker", "--config", "tiny", *[a for s in TINY for a in ("--set", s)]]
    args += [
        "--output",
        str(out),
        "--data-mode",
        "synthetic",
        "--warmup",
        "1",
        "--steps",
        "1",
        "--windows",
        "1",
    ]
    assert main([*args, "--profile"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "ok"
    trace = json.loads((tmp_path / "bench.trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert set(profiling.REGIONS) <= names
    table = (tmp_path / "bench.profile.txt").read_text()
    assert "aten::mm" in table and "Self CPU" in table
    assert json.loads(out.read_text())["protocol"]["profile"] is True


def test_profiled_update_is_a_production_update_with_named_regions():
    recipe = load_recipe(["tiny"], TINY)
    device = setup_runtime(recipe)
    blocks = torch.randint(0, recipe.model.vocab_size, (8, recipe.model.context_length + 1))
    a, b = build_engine(recipe, device), build_engine(recipe, device)
    a.train_step(blocks, 1e-3, 0)
    prof = profiling.profile_update(b, lambda: blocks, 1e-3)
    assert set(profiling.REGIONS) <= {event.key for event in prof.key_averages()}
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_mfu_table_and_formula():
    assert gpu_peak("NVIDIA GH200 480GB").flops_per_second == pytest.approx(989.4e12)
    assert gpu_peak("NVIDIA H200").flops_per_second == pytest.approx(989.4e12)
    assert gpu_peak("NVIDIA H100 PCIe").flops_per_second == pytest.approx(756e12)
    assert gpu_peak("Tesla T4") is None
    assert mfu(6e6, 1000.0, Peak(12e9, "x")) == pytest.approx(0.5)
    assert mfu(6e6, 1000.0, None) is None


def test_training_loop_peak_is_the_same_table_unless_overridden(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(PEAK_FLOPS_ENV, raising=False)
    assert peak_flops("NVIDIA H100 PCIe") == gpu_peak("NVIDIA H100 PCIe").flops_per_second
    assert peak_flops("NVIDIA L40S") == pytest.approx(362e12)
    assert peak_flops("Intel(R) Xeon(R) CPU") is None
    monkeypatch.setenv(PEAK_FLOPS_ENV, "1e12")
    assert peak_flops("NVIDIA H100 PCIe") == 1e12


def test_real_data_mode_reads_the_cache_prefix(tiny_cache: Path, tiny_recipe_args):
    from tiny_llm.data.cache import open_cache

    # A budget of ~21 blocks: the 5 updates of 8 blocks restart the loader on the prefix instead of failing.
    short = ["training.tokens_per_parameter=0.01", "training.epoch_tokens_per_parameter=0.01"]
    recipe = load_recipe(["tiny"], [*TINY, *tiny_recipe_args(tiny_cache), *short])
    out = run_worker(recipe, WorkerOptions(data_mode="real", warmup=2, steps=1, windows=2))
    assert out["status"] == "ok", out["error"]
    assert out["synthetic"] is False and out["protocol"]["data_mode"] == "real"
    assert out["protocol"]["cache_identity"] == open_cache(tiny_cache, verify=False).identity
    missing = load_recipe(["tiny"], [*TINY, *tiny_recipe_args(tiny_cache.parent / "nope")])
    with pytest.raises(DataError):
        run_worker(missing, WorkerOptions(data_mode="real", warmup=1, steps=1, windows=1))
