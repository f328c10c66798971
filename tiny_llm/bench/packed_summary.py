"""Packed benchmark summary: pair packed and sequential results, speedups, a plot (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Pair packed and sequential results by (num_models, compile).

    speedup = sequential s/step / packed s/step; memory_ratio = packed / sequential peak memory.
    """
    pairs: dict[tuple[int, bool], dict[str, dict]] = {}
    for result in results:
        if not {"num_models", "compile", "execution", "status"} <= set(result):
            raise ValueError(
                "not a benchmark-packed-worker result (num_models/compile/execution/status missing)"
            )
        pairs.setdefault((result["num_models"], result["compile"]), {})[result["execution"]] = result
    rows = []
    for (n, compiled), pair in sorted(pairs.items()):
        packed, sequential = pair.get("packed"), pair.get("sequential")
        row: dict[str, Any] = {"num_models": n, "compile": compiled}
        for name, measured in (("packed", packed), ("sequential", sequential)):
            row[name] = None if measured is None else _brief(measured)
        row.update(speedup=None, cpu_time_ratio=None, memory_ratio=None)
        if packed is not None and sequential is not None and packed["status"] == sequential["status"] == "ok":
            row["speedup"] = sequential["seconds_per_step"] / packed["seconds_per_step"]
            cpu = "process_cpu_seconds_per_step"
            if cpu in packed and cpu in sequential:
                row["cpu_time_ratio"] = sequential[cpu] / packed[cpu]
            row["memory_ratio"] = packed["peak_memory_bytes"] / sequential["peak_memory_bytes"]
        rows.append(row)
    return {"rows": rows, "definition": "speedup = sequential seconds/step / packed seconds/step"}


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "status",
        "seconds_per_step",
        "tokens_per_second",
        "process_cpu_seconds_per_step",
        "peak_memory_bytes",
        "components",
        "error",
    )
    return {k: result[k] for k in keys if k in result}


def draw_summary(summary: dict[str, Any]) -> Any:
    """Speedup and peak memory against N: colour = compile setting, marker and dashes = execution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    all_ns: set[int] = set()
    for color, compiled in (("C0", True), ("C1", False)):
        rows = [r for r in summary["rows"] if r["compile"] == compiled and r["speedup"] is not None]
        if not rows:
            continue
        label = "compiled" if compiled else "eager"
        ns = [r["num_models"] for r in rows]
        all_ns.update(ns)
        left.plot(ns, [r["speedup"] for r in rows], color=color, marker="o", label=label)
        for name, style, marker, size in (("packed", "-", "o", 8), ("sequential", "--", "s", 5)):
            gib = [r[name]["peak_memory_bytes"] / 2**30 for r in rows]
            right.plot(
                ns, gib, style, color=color, marker=marker, ms=size, mfc="none", label=f"{name}, {label}"
            )
    left.axhline(1.0, color="grey", linewidth=0.8, linestyle=":", label="no speedup")
    left.set(xlabel="models N", ylabel="speedup (sequential / packed s/step)", title="Packed speedup")
    right.set(xlabel="models N", ylabel="peak memory (GiB)", title="Peak memory")
    for ax in (left, right):
        if all_ns:
            ax.set_xticks(sorted(all_ns))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def plot_summary(summary: dict[str, Any], path: Path) -> None:
    """Write draw_summary's figure to ``path`` (PNG)."""
    from tiny_llm.plotting import save_png

    save_png(draw_summary(summary), path, dpi=120)
