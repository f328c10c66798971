"""The throughput map: tokens/s of each size x context as the microbatch doubles to a confirmed OOM.

Torch-free: each point is a `benchmark-worker` process started the way the tuner starts its candidates
(``tiny_llm.tuning.tuner``: its warm-up, windows, noise figure, timeout and process-group handling). A point's
update is one microbatch (batch_tokens = micro x context), so tokens/s is the microbatch's own. An
out-of-memory is a result (status memory_limit), never a failed job; the frontier walk reruns it once
(``confirm``) before it believes it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tiny_llm.budget import flops_per_token, parameter_count
from tiny_llm.config import ModelConfig, load_recipe
from tiny_llm.errors import ConfigError
from tiny_llm.io import atomic_write_bytes, atomic_write_json, read_json
from tiny_llm.output_dirs import claim_output_dir
from tiny_llm.plotting import save_png
from tiny_llm.tuning import tuner
from tiny_llm.tuning.candidates import window_noise

TRIALS = ("first", "confirm")
OUT_OF_MEMORY = "memory_limit"
TOKENS_PER_PARAMETER = 20
# A point's protocol (the throughput section's keys, the point command's flags).
PROTOCOL_KEYS = (
    "data_mode", "warmup", "steps", "windows", "max_windows", "max_spread", "timeout_seconds",
    "timeout_flops_per_second",
)  # fmt: skip
TIMEOUT_FLOPS_PER_SECOND = 1e14
"""The slowest training rate a point may keep before its timeout takes it for hung: about a tenth of an
H100's or H200's dense BF16 peak (the workflow's throughput.timeout_flops_per_second)."""


def point_overrides(context: int, micro: int, parameters: int, updates: int) -> dict[str, dict[str, Any]]:
    """The recipe keys of one point: this context, one microbatch of ``micro`` sequences per update, and a
    budget of exactly the ``updates`` the worker runs (a 20-tokens-per-parameter budget of 512-token updates
    would be more updates than a recipe may have; the schedule does not change the speed)."""
    per_parameter = updates * micro * context / parameters
    return {
        "model": {"context_length": context},
        "training": {
            "micro_batch_size": micro,
            "batch_tokens": micro * context,
            "tokens_per_parameter": per_parameter,
            "epoch_tokens_per_parameter": per_parameter,
        },
    }


def point_sets(context: int, micro: int, parameters: int, updates: int) -> list[str]:
    """``point_overrides`` as the worker's ``--set`` values (a float as its repr: it reads back the same)."""
    overrides = point_overrides(context, micro, parameters, updates)
    return [
        f"{section}.{key}={value!r}" for section, keys in overrides.items() for key, value in keys.items()
    ]


def protocol_updates(protocol: dict[str, Any]) -> int:
    """Updates one worker runs at most: warm-up, the timed windows (the extra ones too) and the profiled
    update."""
    windows = max(int(protocol["windows"]), int(protocol["max_windows"]))
    return int(protocol["warmup"]) + int(protocol["steps"]) * windows + 1


def point_timeout(protocol: dict[str, Any], model: ModelConfig, context: int, micro: int) -> float:
    """Seconds one point may run: ``timeout_seconds`` (start-up, compilation, a small point's updates) plus
    the training FLOPs of every update it may run (``micro`` x ``context`` tokens each) at
    ``timeout_flops_per_second``. A fixed timeout would end a 500m line at 4,096 tokens before its
    out-of-memory, its large microbatches taking longer than the whole limit."""
    flops = flops_per_token(dataclasses.replace(model, context_length=context))
    work = protocol_updates(protocol) * micro * context * flops
    return float(protocol["timeout_seconds"]) + work / float(protocol["timeout_flops_per_second"])


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
    """Measure one point in its own process and write its record to ``output`` (atomically, last). The
    worker's log and record go into ``<output>.point/``, a directory of the point's own (nothing of anyone
    else's beside ``output`` is truncated or removed)."""
    work = point_directory(output)
    worker_json, log = work / "worker.json", work / "worker.log"
    worker_json.unlink(missing_ok=True)  # a stale output must not pass for this run's
    model = load_recipe([str(recipe)]).model
    parameters = parameter_count(model)
    timeout = point_timeout(protocol, model, context, micro)
    returncode, timed_out = tuner.run_process_group(
        worker_command(recipe, context, micro, worker_json, protocol, parameters), log, timeout
    )
    record: dict[str, Any] = {"context": context, "micro_batch_size": micro, "trial": trial}
    record.update(parameters=parameters, timeout_seconds=round(timeout, 1))
    if timed_out:
        record.update(status="timeout", error=f"killed after its {timeout:,.0f} s timeout")
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


def point_directory(output: Path) -> Path:
    """``<output without .json>.point/``, claimed for the point (marked as tiny-llm's); a non-empty directory
    there that tiny-llm did not write is refused in one line and kept."""
    work = output.with_name(f"{output.stem}.point")
    try:
        return claim_output_dir(work, "the point's work directory")
    except ConfigError:
        raise ConfigError(
            f"--output {output}: {work}, where the point keeps its worker's log and record, is a non-empty "
            "directory that tiny-llm did not write; move it away or choose another --output"
        ) from None


def stopped_by(points: list[dict[str, Any]]) -> str:
    """Why a line (its points in walk order) ended: ok (max_micro_batch reached), out of memory twice,
    failed: the error's first line, or timeout."""
    last = points[-1]
    if last["status"] == "ok":
        return "ok"
    if last["status"] == OUT_OF_MEMORY:
        return "out of memory twice" if last["trial"] == "confirm" else "out of memory once (not confirmed)"
    if last["status"] == "timeout":
        return f"timeout ({last['error']})" if last.get("error") else "timeout"
    first_line = (str(last.get("error") or "").strip().splitlines() or ["no error recorded"])[0]
    return f"failed: {first_line}"


def unmeasured_points(summary: dict[str, Any], point_path: Callable[[str, int, int, str], str]) -> list[str]:
    """One line per failed or timed-out point of ``summary``, naming its record (``--forcerun`` it to measure
    it again)."""
    lines = []
    for row in summary["lines"]:
        for p in row["points"]:
            if p["status"] in ("failed", "timeout"):
                path = point_path(row["size"], row["context"], p["micro_batch_size"], p["trial"])
                lines.append(f"  {path}: {stopped_by([p])}")
    return lines


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
        walk = sorted(found, key=lambda p: (p["micro_batch_size"], TRIALS.index(p["trial"])))
        rows.append(
            {
                "size": size,
                "context": context,
                "parameters": sizes[size],
                "max_micro_batch_fits": max((p["micro_batch_size"] for p in ok), default=None),
                "out_of_memory_confirmed": confirmed,
                "stopped_by": stopped_by(walk),
                "best_micro_batch": best["micro_batch_size"] if best else None,
                "tokens_per_second": rate,
                "gpu_hours_20_tokens_per_parameter": (
                    TOKENS_PER_PARAMETER * sizes[size] / rate / 3600 if rate else None
                ),
                "points": walk,
            }
        )
    rows.sort(key=lambda r: (sizes[r["size"]], r["context"]))
    return {"lines": rows, "tokens_per_parameter": TOKENS_PER_PARAMETER}


def table(summary: dict[str, Any]) -> str:
    """The report's Markdown table: one row per size x context, with what stopped the line."""
    head = (
        "| size | context | max micro fitting | OOM twice | best micro | tokens/s | T = 20 P/R (GPU h) | "
        "stopped by |"
    )
    lines = [head, "|---|---:|---:|---|---:|---:|---:|---|"]
    for r in summary["lines"]:
        rate, hours = r["tokens_per_second"], r["gpu_hours_20_tokens_per_parameter"]
        reason = (r.get("stopped_by") or stopped_by(r["points"])).replace("|", "\\|")
        lines.append(
            f"| {r['size']} | {r['context']} | {r['max_micro_batch_fits'] or '-'} | "
            f"{'yes' if r['out_of_memory_confirmed'] else 'no'} | {r['best_micro_batch'] or '-'} | "
            f"{f'{rate:,.0f}' if rate else '-'} | {f'{hours:,.3f}' if hours else '-'} | {reason[:120]} |"
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


def estimate(settings: dict[str, Any], models: dict[str, ModelConfig]) -> dict[str, Any]:
    """GPU hours of the map before anything runs, at most: every line doubles to max_micro_batch, plus the
    out-of-memory point and its confirmation, and every point runs to its timeout (point_timeout).
    ``models`` maps each size to its model."""
    doublings = int(math.log2(settings["max_micro_batch"])) + 1
    micros = [2**i for i in range(doublings)]
    per_line = doublings + 2
    seconds = sum(
        sum(point_timeout(settings, model, context, micro) for micro in micros)
        + 2 * point_timeout(settings, model, context, micros[-1])
        for model in models.values()
        for context in settings["contexts"]
    )
    lines = len(models) * len(settings["contexts"])
    return {
        "lines": lines,
        "points_at_most": lines * per_line,
        "timeout_seconds": settings["timeout_seconds"],
        "timeout_flops_per_second": settings["timeout_flops_per_second"],
        "gpu_hours_at_most": round(seconds / 3600, 2),
        "parameters": {size: parameter_count(model) for size, model in models.items()},
    }
