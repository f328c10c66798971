"""The throughput map: tokens/s of each size x context as the microbatch doubles to a confirmed OOM.

Torch-free: each point is a `benchmark-worker` process started the way the tuner starts its candidates
(``tiny_llm.tuning.tuner``: its warm-up, windows, noise figure, timeout and process-group handling). A point's
update is one microbatch (batch_tokens = micro x context), so tokens/s is the microbatch's own. An
out-of-memory is a result (status memory_limit), never a failed job; the frontier walk reruns it once
(``confirm``) before it believes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tiny_llm.budget import parameter_count
from tiny_llm.config import load_recipe
from tiny_llm.io import atomic_write_bytes, atomic_write_json, read_json
from tiny_llm.plotting import save_png
from tiny_llm.tuning import tuner
from tiny_llm.tuning.candidates import window_noise

TRIALS = ("first", "confirm")
OUT_OF_MEMORY = "memory_limit"
TOKENS_PER_PARAMETER = 20
# A point's protocol (the throughput section's keys, the point command's flags).
PROTOCOL_KEYS = ("data_mode", "warmup", "steps", "windows", "max_windows", "max_spread", "timeout_seconds")


def point_sets(context: int, micro: int, parameters: int, updates: int) -> list[str]:
    """The recipe keys of one point: this context, one microbatch of ``micro`` sequences per update, and a
    budget of exactly the ``updates`` the worker runs (a 20-tokens-per-parameter budget of 512-token updates
    would be more updates than a recipe may have; the schedule does not change the speed)."""
    per_parameter = updates * micro * context / parameters
    return [
        f"model.context_length={context}",
        f"training.micro_batch_size={micro}",
        f"training.batch_tokens={micro * context}",
        f"training.tokens_per_parameter={per_parameter!r}",
        f"training.epoch_tokens_per_parameter={per_parameter!r}",
    ]


def protocol_updates(protocol: dict[str, Any]) -> int:
    """Updates one worker runs at most: warm-up, the timed windows (the extra ones too) and the profiled
    update."""
    windows = max(int(protocol["windows"]), int(protocol["max_windows"]))
    return int(protocol["warmup"]) + int(protocol["steps"]) * windows + 1


def frontier(
    result_of: Callable[[int, str], dict[str, Any]], max_micro_batch: int
) -> Iterator[tuple[int, str]]:
    """The points of one size x context in the order they run: micro 1, 2, 4, ... until an out-of-memory
    seen twice (the point rerun once), a failure, or ``max_micro_batch``. ``result_of(micro, trial)`` is a
    finished point's result; the walk asks for it only after yielding the point, so a workflow can stop the
    walk at the first point that has not run yet."""
    micro = 1
    while micro <= max_micro_batch:
        yield micro, "first"
        status = result_of(micro, "first")["status"]
        if status == OUT_OF_MEMORY:
            yield micro, "confirm"
            status = result_of(micro, "confirm")["status"]
            if status == OUT_OF_MEMORY:
                return
        if status != "ok":
            return  # a failed or timed-out point says nothing about larger microbatches
        micro *= 2


def worker_command(
    recipe: Path, context: int, micro: int, output: Path, protocol: dict[str, Any], parameters: int
) -> list[str]:
    cmd = [*tuner.WORKER, "--config", str(recipe)]
    for key in point_sets(context, micro, parameters, protocol_updates(protocol)):
        cmd += ["--set", key]
    cmd += ["--output", str(output), "--data-mode", protocol["data_mode"]]
    for key in ("warmup", "steps", "windows", "max_windows", "max_spread"):
        cmd += [f"--{key.replace('_', '-')}", str(protocol[key])]
    return cmd


def run_point(
    recipe: Path, context: int, micro: int, output: Path, protocol: dict[str, Any], trial: str = "first"
) -> dict[str, Any]:
    """Measure one point in its own process and write its record to ``output`` (atomically, last)."""
    worker_json = output.with_suffix(".worker.json")
    log = output.with_suffix(".log")
    worker_json.unlink(missing_ok=True)  # a stale output must not pass for this run's
    timeout = float(protocol["timeout_seconds"])
    parameters = parameter_count(load_recipe([str(recipe)]).model)
    returncode, timed_out = tuner.run_process_group(
        worker_command(recipe, context, micro, worker_json, protocol, parameters), log, timeout
    )
    record: dict[str, Any] = {"context": context, "micro_batch_size": micro, "trial": trial}
    record["parameters"] = parameters
    if timed_out:
        record.update(status="timeout", error=f"killed after the {timeout:.0f} s point timeout")
    elif worker_json.is_file():
        worker = read_json(worker_json)
        rates = [m["tokens_per_second"] for m in worker.get("measurements") or []]
        record.update(
            status=worker["status"],
            error=worker.get("error"),
            tokens_per_second=worker.get("tokens_per_second"),
            peak_memory_bytes=worker.get("peak_memory_bytes"),
            window_tokens_per_second=rates or None,
            noise_tokens_per_second=window_noise(rates) if rates else None,
        )
    else:
        record.update(status="failed", error=f"worker exited with code {returncode}: {tuner._log_tail(log)}")
    atomic_write_json(output, record)
    return record


def summarize(points: list[dict[str, Any]], sizes: dict[str, int]) -> dict[str, Any]:
    """Per size x context: the measured points, the largest microbatch that fits, the best tokens/s R and
    T = 20 P / R in GPU hours. ``points`` carry their size; ``sizes`` maps a size to its parameters P."""
    lines: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for point in points:
        lines.setdefault((point["size"], point["context"]), []).append(point)
    rows: list[dict[str, Any]] = []
    for (size, context), found in lines.items():
        ok = [p for p in found if p["status"] == "ok" and p.get("tokens_per_second")]
        best = max(ok, key=lambda p: p["tokens_per_second"], default=None)
        confirmed = any(p["trial"] == "confirm" and p["status"] == OUT_OF_MEMORY for p in found)
        rate = best["tokens_per_second"] if best else None
        rows.append(
            {
                "size": size,
                "context": context,
                "parameters": sizes[size],
                "max_micro_batch_fits": max((p["micro_batch_size"] for p in ok), default=None),
                "out_of_memory_confirmed": confirmed,
                "best_micro_batch": best["micro_batch_size"] if best else None,
                "tokens_per_second": rate,
                "gpu_hours_20_tokens_per_parameter": (
                    TOKENS_PER_PARAMETER * sizes[size] / rate / 3600 if rate else None
                ),
                "points": sorted(found, key=lambda p: (p["micro_batch_size"], TRIALS.index(p["trial"]))),
            }
        )
    rows.sort(key=lambda r: (sizes[r["size"]], r["context"]))
    return {"lines": rows, "tokens_per_parameter": TOKENS_PER_PARAMETER}


def table(summary: dict[str, Any]) -> str:
    """The report's Markdown table: one row per size x context."""
    head = "| size | context | max micro fitting | OOM twice | best micro | tokens/s | T = 20 P/R (GPU h) |"
    lines = [head, "|---|---:|---:|---|---:|---:|---:|"]
    for r in summary["lines"]:
        rate, hours = r["tokens_per_second"], r["gpu_hours_20_tokens_per_parameter"]
        lines.append(
            f"| {r['size']} | {r['context']} | {r['max_micro_batch_fits'] or '-'} | "
            f"{'yes' if r['out_of_memory_confirmed'] else 'no'} | {r['best_micro_batch'] or '-'} | "
            f"{f'{rate:,.0f}' if rate else '-'} | {f'{hours:,.3f}' if hours else '-'} |"
        )
    return "\n".join(lines) + "\n"


def draw(summary: dict[str, Any]) -> Any:
    """tokens/s against microbatch, one panel per size, one line per context; the OOM point as a cross."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import compact_axis, line_styles

    sizes = list(dict.fromkeys(r["size"] for r in summary["lines"]))
    fig, axes = plt.subplots(1, max(1, len(sizes)), figsize=(4.5 * max(1, len(sizes)), 3.6), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=False):
        rows = [r for r in summary["lines"] if r["size"] == size]
        for row, style in zip(rows, line_styles(len(rows)), strict=True):
            ok = [p for p in row["points"] if p["status"] == "ok" and p["trial"] == "first"]
            ax.plot(
                [p["micro_batch_size"] for p in ok],
                [p["tokens_per_second"] for p in ok],
                label=f"context {row['context']}",
                **style,
            )
            oom = [p["micro_batch_size"] for p in row["points"] if p["status"] == OUT_OF_MEMORY]
            if oom and ok:
                ax.plot([max(oom)], [ok[-1]["tokens_per_second"]], "x", color=ax.lines[-1].get_color())
        ax.set_xscale("log", base=2)
        ax.set_title(size)
        ax.set_xlabel("microbatch (sequences)")
        ax.set_ylabel("tokens/s")
        compact_axis(ax.yaxis)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_report(
    points: list[Path], sizes: dict[str, int], summary_path: Path, table_path: Path, plot: Path
) -> dict[str, Any]:
    """Read the finished points (results/throughput/<size>/ctx<L>/m<M>-<trial>.json) and write the summary
    JSON, the Markdown table and the plot."""
    records = [{**read_json(path), "size": Path(path).parts[-3]} for path in points]
    summary = summarize(records, sizes)
    atomic_write_json(summary_path, summary)
    atomic_write_bytes(table_path, table(summary).encode())
    save_png(draw(summary), plot)
    return summary


def estimate(settings: dict[str, Any], sizes: dict[str, int]) -> dict[str, Any]:
    """GPU hours of the map before anything runs, at most: every line doubles to max_micro_batch, plus the
    out-of-memory point and its confirmation, and every point runs to its timeout."""
    per_line = int(math.log2(settings["max_micro_batch"])) + 1 + 2
    lines = len(settings["sizes"]) * len(settings["contexts"])
    seconds = lines * per_line * settings["timeout_seconds"]
    return {
        "lines": lines,
        "points_at_most": lines * per_line,
        "timeout_seconds": settings["timeout_seconds"],
        "gpu_hours_at_most": round(seconds / 3600, 2),
        "parameters": sizes,
    }
