"""The horizon study's report (torch-free; matplotlib for the plot): final validation loss against the
training horizon in tokens per parameter, mean and sample SD over seeds, from the branch runs; one line per
model size when the study has several."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_json, atomic_write_text, read_json, read_yaml
from tiny_llm.output_dirs import check_output_dir, claim_output_dir


def horizon_rows(run_dirs: list[str | Path]) -> list[dict[str, Any]]:
    """One row per size and horizon: its runs' final full-validation losses (by seed), their mean, SD and
    standard error; their bits per byte (by seed) and its mean and SD (None where a run has none)."""
    by_point: dict[tuple[int, float], dict[int, dict[str, Any]]] = {}
    for run_dir in map(Path, run_dirs):
        recipe, result = read_yaml(run_dir / "resolved.yaml"), read_json(run_dir / "result.json")
        point = (int(result.get("parameters", 0)), float(recipe["training"]["tokens_per_parameter"]))
        by_point.setdefault(point, {})[int(recipe["runtime"]["seed"])] = result["final_validation"]
    rows = []
    for (parameters, horizon), finals in sorted(by_point.items()):
        seeds = sorted(finals)
        values = [finals[s]["loss"] for s in seeds]
        bpb = [finals[s].get("bpb") for s in seeds]
        known = [b for b in bpb if b is not None]
        sd = statistics.stdev(values) if len(values) > 1 else None
        rows.append(
            {
                "parameters": parameters,
                "tokens_per_parameter": horizon,
                "losses": {str(s): v for s, v in zip(seeds, values, strict=True)},
                "mean_loss": statistics.fmean(values),
                "sd_loss": sd,
                "se_loss": None if sd is None else sd / math.sqrt(len(values)),
                "bpb": {str(s): b for s, b in zip(seeds, bpb, strict=True)},
                "mean_bpb": statistics.fmean(known) if known and len(known) == len(bpb) else None,
                "sd_bpb": statistics.stdev(known) if len(known) == len(bpb) > 1 else None,
            }
        )
    return rows


def write_horizons_report(run_dirs: list[str | Path], output_dir: str | Path) -> list[dict[str, Any]]:
    """horizons.json, report.md and loss-vs-horizon.png in ``output_dir`` (new, empty or one of ours:
    check_output_dir)."""
    check_output_dir(output_dir, "--output-dir")
    rows = horizon_rows(run_dirs)
    out = claim_output_dir(output_dir, "--output-dir")
    atomic_write_json(out / "horizons.json", {"horizons": rows})
    sizes = len({row["parameters"] for row in rows}) > 1  # a column for the size only when there are several
    lines = [
        "| Tokens/param | Final loss (mean) | SD | SE | bpb (mean) | Seeds |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    if sizes:
        lines = ["| Parameters " + lines[0], "|---:" + lines[1]]
    for row in rows:
        cells = [f"{row['parameters']:,}"] if sizes else []
        cells += [f"{row['tokens_per_parameter']:g}", f"{row['mean_loss']:.6f}"]
        cells += [_cell(row["sd_loss"], 6), _cell(row["se_loss"], 6), _cell(row["mean_bpb"], 4)]
        lines.append("| " + " | ".join([*cells, str(len(row["losses"]))]) + " |")
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    _plot(rows, out / "loss-vs-horizon.png")
    return rows


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    from tiny_llm.plotting import save_png

    save_png(draw(rows), path)


def draw(rows: list[dict[str, Any]]) -> Any:
    """Loss against horizon: each horizon's mean final loss (± SD over seeds) and its seeds' losses, on a log
    axis ticked at the horizons themselves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = sorted({r["parameters"] for r in rows})
    for parameters in sizes:
        line = [r for r in rows if r["parameters"] == parameters]
        x, y = [r["tokens_per_parameter"] for r in line], [r["mean_loss"] for r in line]
        label = f"{parameters:,} parameters" if len(sizes) > 1 else None
        err = [r["sd_loss"] or 0.0 for r in line]
        bars = ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
        for row in line:
            ax.scatter(
                [row["tokens_per_parameter"]] * len(row["losses"]), list(row["losses"].values()), s=10,
                alpha=0.5, color=bars[0].get_color(),
            )  # fmt: skip
    if len(sizes) > 1:
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    horizons = sorted({r["tokens_per_parameter"] for r in rows})  # every size's, not the last line's
    ax.set_xticks(horizons, [f"{horizon:g}" for horizon in horizons])  # 0.05, not a minor tick's 6 x 10^-2
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training horizon (tokens per parameter)")
    ax.set_ylabel("final validation loss (nats)")
    ax.set_title("WSD: loss against horizon (branches of one trunk)")
    ax.grid(True, alpha=0.3)
    return fig
