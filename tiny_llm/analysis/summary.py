"""Summary of analysis jobs (torch-free; matplotlib for the figures): summary.csv, manifest.json, figures.

One row of summary.csv per checkpoint x case (a job's result.json). Figures, x = the checkpoint's training
step:

- ``alignment.png``: normalised noise alignment sum v^T H v / sum |v|^2 per case beside the isotropic
  reference tr(H)/D (Rademacher) and, for packed runs, the normalised consensus alignment; linear and log.
- ``noise-alignment.png``: the noise alignment sum v^T H v / S per case.
- ``norms.png``: mean |g_k|, mean |v_k| and |mean gradient| per case, with the gradient norm training logged
  (``--metrics``: the pre-clip norm of each update, averaged over each logging window).
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from pathlib import Path
from typing import Any

from tiny_llm.errors import DataError
from tiny_llm.io import atomic_write_json, atomic_write_text, canonical_json, read_json
from tiny_llm.output_dirs import check_output_dir, claim_output_dir
from tiny_llm.train.metrics import read_metrics

COLUMNS = (
    "run",
    "checkpoint",
    "case",
    "step",
    "epoch",
    "tokens",
    "epoch_loss",
    "noise_samples",
    "random_samples",
    "dimension",
    "noise_alignment",
    "normalized_noise_alignment",
    "normalized_random_alignment",
    "alignment_ratio",
    "average_noise_norm",
    "average_batch_gradient_norm",
    "mean_gradient_norm",
    "consensus_workers",
    "consensus_alignment",
    "normalized_consensus_alignment",
    "average_consensus_norm",
    "seconds",
    "identity",
)
FIGURES = ("alignment.png", "noise-alignment.png", "norms.png")
CASE_STYLES = {
    "seen": {"color": "C0", "markersize": 8.5, "linewidth": 2.4},
    "unseen": {"color": "C1", "markersize": 5.0, "linewidth": 1.4, "markerfacecolor": "none"},
}
"""Filled large markers and thick lines under hollow small ones and thin lines: equal values stay visible."""


def _case_style(case: str, **style: Any) -> dict[str, Any]:
    return {**CASE_STYLES.get(case, {"color": "C2"}), **style}


def load_result(path: str | Path) -> dict[str, Any]:
    """A job's result.json, given the file or its directory."""
    path = Path(path)
    if path.is_dir():
        path = path / "result.json"
    try:
        result = read_json(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a finished analysis (run analyze first): {exc}") from None
    if result.get("format") != "tiny-llm-analysis" or "statistics" not in result:
        raise DataError(f"{path}: not an analysis result.json")
    return result


def summary_row(result: dict[str, Any]) -> dict[str, Any]:
    checkpoint, stats = result["checkpoint"], result["statistics"]
    row = {
        "run": Path(result["run"]).name,
        "checkpoint": checkpoint["name"],
        "case": result["case"],
        "step": checkpoint["step"],
        "epoch": checkpoint["epoch"],
        "tokens": checkpoint["tokens"],
        "epoch_loss": result["epoch_loss"],
        "seconds": result["seconds"],
        "identity": result["identity"],
    }
    row.update({k: stats.get(k) for k in COLUMNS if k not in row})
    return row


def summary_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [summary_row(r) for r in results]
    return sorted(rows, key=lambda r: (r["run"], r["step"], r["checkpoint"], r["case"]))


def csv_text(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in COLUMNS})
    return out.getvalue()


def training_norms(metrics: Path | None) -> list[tuple[int, float]]:
    """(step, grad_norm) of the train rows of a metrics.jsonl (a resumed run's repeats: the last)."""
    if metrics is None:
        return []
    points = {}
    for row in read_metrics(Path(metrics)):
        value = row.get("grad_norm")
        if row.get("event") == "train" and isinstance(value, (int, float)) and math.isfinite(value):
            points[int(row["step"])] = float(value)
    return sorted(points.items())


# ----------------------------------------------------------------------------- figures


def _series(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(run, case) -> [(step, value)] of the rows where ``key`` has a value."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out.setdefault((row["run"], row["case"]), []).append((row["step"], float(value)))
    return {k: sorted(v) for k, v in out.items()}


def _label(run: str, case: str, several_runs: bool, what: str = "") -> str:
    parts = [run] if several_runs else []
    return " ".join([*parts, case, what]).strip()


def _finish_axis(ax: Any, ylabel: str, *, log: bool = False) -> None:
    from tiny_llm.plotting import compact_axis, plain_log_axis

    ax.set_xlabel("training step (updates) of the checkpoint")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
        plain_log_axis(ax.yaxis)
    compact_axis(ax.xaxis, integer=True)
    ax.grid(alpha=0.3, which="both" if log else "major")


def _plot(ax: Any, points: list[tuple[int, float]], *, log: bool, **style: Any) -> int:
    """Plot ``points`` (positive ones only on a log axis); return how many were left out."""
    kept = [(x, y) for x, y in points if y > 0] if log else points
    if kept:
        xs, ys = zip(*kept, strict=True)
        ax.plot(xs, ys, **style)
    return len(points) - len(kept)


def draw_alignment(rows: list[dict[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several = len({r["run"] for r in rows}) > 1
    noise = _series(rows, "normalized_noise_alignment")
    isotropic = _series(rows, "normalized_random_alignment")
    consensus = _series(rows, "normalized_consensus_alignment")
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 4.4), layout="constrained")
    for ax, log in zip(axes, (False, True), strict=True):
        hidden = 0
        for (run, case), points in noise.items():
            label = _label(run, case, several, "noise: Σ vᵀHv / Σ|v|²")
            hidden += _plot(ax, points, log=log, label=label, **_case_style(case, marker="o"))
        for (run, case), points in isotropic.items():
            label = _label(run, case, several, "isotropic: tr(H)/D")
            hidden += _plot(ax, points, log=log, label=label, **_case_style(case, marker="s", linestyle="--"))
        for (run, case), points in consensus.items():
            label = _label(run, case, several, "consensus: Σ eᵀHe / Σ|e|²")
            hidden += _plot(ax, points, log=log, label=label, **_case_style(case, marker="^", linestyle=":"))
        _finish_axis(ax, "curvature along the direction (nats / unit²)", log=log)
        title = "log scale" if log else "linear scale"
        if hidden:
            title += f" ({hidden} value{'s' if hidden != 1 else ''} ≤ 0 not shown)"
        ax.set_title(title)
    axes[0].axhline(0.0, color="0.5", linewidth=0.8)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8.5)
    fig.suptitle("Normalised alignment of gradient noise with the Hessian of the epoch loss")
    return fig


def draw_noise_alignment(rows: list[dict[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several = len({r["run"] for r in rows}) > 1
    fig, ax = plt.subplots(figsize=(8.5, 4.4), layout="constrained")
    for (run, case), points in _series(rows, "noise_alignment").items():
        label = _label(run, case, several, "Σ vᵀHv / S")
        _plot(ax, points, log=False, label=label, **_case_style(case, marker="o"))
    for (run, case), points in _series(rows, "consensus_alignment").items():
        label = _label(run, case, several, "consensus: mean eᵀHe")
        _plot(ax, points, log=False, label=label, **_case_style(case, marker="^", linestyle=":"))
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    _finish_axis(ax, "vᵀHv averaged over noise samples")
    ax.set_title("Noise alignment (unnormalised)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def draw_norms(rows: list[dict[str, Any]], logged: list[tuple[int, float]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several = len({r["run"] for r in rows}) > 1
    fig, ax = plt.subplots(figsize=(8.5, 4.6), layout="constrained")
    if logged:
        steps, norms = zip(*logged, strict=True)
        ax.plot(
            steps,
            norms,
            color="0.55",
            linewidth=1.0,
            label="training log: grad_norm (each row's last update)",
        )
    kinds = (
        ("average_batch_gradient_norm", "mean |g_k| (batch gradient)", "o", "-"),
        ("average_noise_norm", "mean |v_k| (noise)", "s", "--"),
        ("mean_gradient_norm", "|mean gradient| (epoch)", "D", ":"),
    )
    for key, what, marker, linestyle in kinds:
        for (run, case), points in _series(rows, key).items():
            style = _case_style(case, marker=marker, linestyle=linestyle)
            _plot(ax, points, log=True, label=_label(run, case, several, what), **style)
    _finish_axis(ax, "L2 norm", log=True)
    ax.set_title("Gradient and noise norms at the checkpoints")
    if ax.get_legend_handles_labels()[0]:  # below the axes: at their side, 7 long entries took half the width
        fig.legend(loc="outside lower center", ncols=2, fontsize=8.5)
    return fig


# ----------------------------------------------------------------------------- the summary


SUMMARY_FORMAT = "tiny-llm-analysis-summary"


def write_summary(
    inputs: list[str | Path], output_dir: str | Path, metrics: str | Path | None = None
) -> dict[str, Any]:
    """summary.csv, manifest.json and the figures of the jobs in ``inputs`` (directories or result.json)."""
    from tiny_llm.plotting import save_png

    if not inputs:
        raise DataError("analysis-summary: no --inputs given")
    # the workflow's layout: the jobs' directories, then their summary beside them
    jobs = [Path(path) if Path(path).is_dir() else Path(path).parent for path in inputs]
    check_output_dir(output_dir, "--output-dir", inputs=jobs)
    results = [load_result(path) for path in inputs]
    rows = summary_rows(results)
    seen: dict[tuple[str, str, str], str] = {}
    for result, path in zip(results, inputs, strict=True):
        row = summary_row(result)
        key = (row["run"], row["checkpoint"], row["case"])
        if key in seen:
            raise DataError(f"analysis-summary: {path} and {seen[key]} both analyse {'/'.join(key)}")
        seen[key] = str(path)
    out = claim_output_dir(output_dir, "--output-dir", inputs=jobs)
    atomic_write_text(out / "summary.csv", csv_text(rows))
    logged = training_norms(Path(metrics) if metrics else None)
    save_png(draw_alignment(rows), out / "alignment.png")
    save_png(draw_noise_alignment(rows), out / "noise-alignment.png")
    save_png(draw_norms(rows, logged), out / "norms.png")
    identities = sorted(r["identity"] for r in results)
    manifest = {
        "format": SUMMARY_FORMAT,
        "inputs": [{"path": str(p), "identity": r["identity"]} for p, r in zip(inputs, results, strict=True)],
        "metrics": str(metrics) if metrics else None,
        "rows": len(rows),
        "files": ["summary.csv", *FIGURES],
        "identity": hashlib.sha256(canonical_json(identities).encode()).hexdigest(),
    }
    atomic_write_json(out / "manifest.json", manifest)
    return manifest
