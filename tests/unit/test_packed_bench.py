"""Packed benchmark worker and summary on the tiny shape (eager, a few updates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny_llm.bench.packed import PackedBenchOptions, run_packed_benchmark
from tiny_llm.bench.packed_summary import summarize
from tiny_llm.cli import main
from tiny_llm.config import load_recipe


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packed-bench")
    recipe = load_recipe(["packed4-tiny"], ["runtime.cpu_threads=1"])
    out = {}
    for execution in ("packed", "sequential"):
        options = PackedBenchOptions(
            execution=execution,
            warmup=2,
            steps=2,
            component_steps=1,
            trace=folder / f"{execution}.trace.json",
        )
        out[execution] = run_packed_benchmark(recipe, options)
    return out


def test_sequential_runs_the_same_updates_as_packed(results):
    packed, sequential = results["packed"], results["sequential"]
    assert packed["status"] == sequential["status"] == "ok", (packed.get("error"), sequential.get("error"))
    # same init, inputs, per-worker clipping, AdamW and mixing: the same loss after four updates
    assert packed["loss"] == pytest.approx(sequential["loss"], rel=1e-5)
    for result in (packed, sequential):
        assert set(result["components"]) == {"compute", "clipping", "mixing", "optimizer"}
        assert result["tokens_per_second"] == pytest.approx(1024 / result["seconds_per_step"])
        assert result["peak_memory_bytes"] > 0 and result["num_models"] == 4 and not result["compile"]
        trace = json.loads(Path(result["trace"]).read_text())
        names = {event.get("name") for event in trace["traceEvents"]}
        assert {"compute", "clipping", "mixing", "optimizer"} <= names


def test_summary_pairs_executions_and_computes_speedup(results, tmp_path):
    summary = summarize([results["sequential"], results["packed"]])
    (row,) = summary["rows"]
    expected = results["sequential"]["seconds_per_step"] / results["packed"]["seconds_per_step"]
    assert row["num_models"] == 4 and row["speedup"] == pytest.approx(expected)
    paths = []
    for name, result in results.items():
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(result))
    argv = ["benchmark-packed-summary", "--inputs", *map(str, paths), "--output", str(tmp_path / "s.json")]
    assert main([*argv, "--plot", str(tmp_path / "speedup.png")]) == 0
    assert (tmp_path / "speedup.png").stat().st_size > 0
    lonely = summarize([results["packed"]])["rows"][0]
    assert lonely["speedup"] is None and lonely["sequential"] is None


def test_worker_rejects_an_ordinary_recipe(tmp_path, capsys):
    code = main(
        [
            "benchmark-packed-worker",
            "--config",
            "tiny",
            "--execution",
            "packed",
            "--output",
            str(tmp_path / "x"),
        ]
    )
    assert code == 2 and "needs a packed recipe" in capsys.readouterr().err


def test_plot_keeps_legends_off_the_data_and_ticks_on_the_model_counts():
    import matplotlib.pyplot as plt

    from tiny_llm.bench.packed_summary import draw_summary

    def row(n, compiled, speedup, gib):
        memory = {"peak_memory_bytes": gib * 2**30}
        return {
            "num_models": n,
            "compile": compiled,
            "speedup": speedup,
            "packed": memory,
            "sequential": memory,
        }

    rows = [row(2, False, 1.3, 0.5), row(4, False, 1.8, 0.6), row(4, True, 2.0, 0.6), row(8, True, 2.5, 0.9)]
    fig = draw_summary({"rows": rows})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    try:
        left, right = fig.axes
        for ax in (left, right):
            legend = ax.get_legend()
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
            assert list(ax.get_xticks()) == [2, 4, 8]
        # packed and sequential memory are equal here: the two lines must still be told apart
        styles = {(line.get_marker(), line.get_linestyle(), line.get_color()) for line in right.get_lines()}
        assert len(styles) == 4
        assert [t.get_text() for t in left.get_legend().get_texts()] == ["compiled", "eager", "no speedup"]
    finally:
        plt.close(fig)
