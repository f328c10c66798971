"""Comparison report of finished training runs (torch-free; matplotlib for the plot).

``write_report(runs_dir, out_dir)`` finds every run directory with a
``result.json`` under ``runs_dir`` and writes:

- ``comparison.json``: one row per run {run, stage, preset, parameters, lr,
  weight_decay, beta2, loss, tokens, median_tokens_per_second, peak_memory_bytes};
- ``report.md``: the same rows as a Markdown table;
- ``learning-curves.png``: subset validation loss vs training tokens, one panel per size;
- ``selected-<size>.yaml``: the complete recipe of each size's best run.

Rows are ordered by stage, then by rank (final full-validation loss; ties ->
lower lr, weight decay, beta2), the order the campaign promotes in.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.campaign import RunOutcome, final_loss, rank_key
from tiny_llm.errors import DataError
from tiny_llm.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json

GIB = 1024**3
TABLE_HEADER = ("Run", "Parameters", "LR", "Decay", "β2", "Final loss", "Tokens", "Median tok/s", "Peak GiB")
SHAPE_KEYS = ("vocab_size", "num_layers", "width", "num_heads", "ffn_width", "context_length")


@dataclass
class RunRecord:
    """One finished run as the report sees it."""

    run: str
    stage: str | None
    preset: str
    parameters: int | None
    lr: float | None
    weight_decay: float | None
    beta2: float | None
    loss: float | None
    tokens: int | None
    median_tokens_per_second: float | None
    peak_memory_bytes: int | None
    status: str
    """'complete', or 'diverged' for a run that stopped on a non-finite loss (no final loss)."""
    recipe: dict[str, Any] = field(repr=False)
    curve: list[tuple[int, float]] = field(repr=False)

    def row(self) -> dict[str, Any]:
        keys = ("run", "stage", "preset", "parameters", "lr", "weight_decay", "beta2", "loss", "tokens")
        out = {k: getattr(self, k) for k in keys}
        out["median_tokens_per_second"] = self.median_tokens_per_second
        out["peak_memory_bytes"] = self.peak_memory_bytes
        return out

    def sort_key(self) -> tuple:
        inf = math.inf
        outcome = RunOutcome(
            self.run,
            self.loss if self.loss is not None else inf,
            self.lr if self.lr is not None else inf,
            self.weight_decay if self.weight_decay is not None else inf,
            self.beta2 if self.beta2 is not None else inf,
        )
        return (_stage_order(self.stage), rank_key(outcome))


def _stage_order(stage: str | None) -> tuple[int, str]:
    match = re.fullmatch(r"stage(\d+)", stage or "")
    return (int(match.group(1)), "") if match else (10**9, stage or "")


# ----------------------------------------------------------------------------- reading


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a torn last line (a crash mid-write) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def median_train_rate(rows: list[dict[str, Any]]) -> float | None:
    rates = [
        r["tokens_per_second"]
        for r in rows
        if r.get("event") == "train" and _number(r.get("tokens_per_second"))
    ]
    return float(statistics.median(rates)) if rates else None


def subset_curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(training tokens, subset validation loss) after every epoch."""
    points = {}
    for r in rows:
        subset = r.get("event") == "validation" and r.get("split", "subset") == "subset"
        if subset and _number(r.get("tokens")) and _number(r.get("loss")):
            points[int(r["tokens"])] = float(r["loss"])  # a resumed run may repeat a row: keep the last
    return sorted(points.items())


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shape_key(recipe: dict[str, Any]) -> tuple | None:
    """Model shape plus the number of packed models (packed presets share their base shape)."""
    model = recipe.get("model") or {}
    if not all(k in model for k in SHAPE_KEYS):
        return None
    packed = (recipe.get("decentralized") or {}).get("num_models", 1)
    return (*(model[k] for k in SHAPE_KEYS), packed)


def _preset_shapes() -> dict[tuple, str]:
    shapes = {}
    folder = resources.files("tiny_llm") / "presets"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".yaml"):
            key = _shape_key(yaml.safe_load(item.read_text(encoding="utf-8")) or {})
            if key is not None:
                shapes.setdefault(key, item.name[: -len(".yaml")])
    return shapes


def _campaign_sizes(runs_dir: Path) -> dict[str, str]:
    """Run id -> size, from a campaign.json in the runs directory."""
    record = runs_dir / "campaign.json"
    if not record.is_file():
        return {}
    return {run: stage["size"] for stage in read_json(record).get("stages", []) for run in stage["runs"]}


def _size_of(run: str, recipe: dict[str, Any], sizes: dict[str, str], shapes: dict[tuple, str]) -> str:
    if run in sizes:
        return sizes[run]
    key = _shape_key(recipe)
    if key is None:
        return "unknown"
    return shapes.get(key, f"{recipe['model']['num_layers']}x{recipe['model']['width']}")


def _load_recipe(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "resolved.yaml"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load_run(run_dir: Path, runs_dir: Path, sizes: dict[str, str], shapes: dict[tuple, str]) -> RunRecord:
    result = read_json(run_dir / "result.json")
    recipe = _load_recipe(run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    opt = recipe.get("optimizer") or {}
    relative = run_dir.relative_to(runs_dir).parts
    loss = final_loss(result)
    median = median_train_rate(metrics)
    if median is None and _number(result.get("training_tokens_per_second")):
        median = float(result["training_tokens_per_second"])
    peak = result.get("peak_memory_bytes")
    return RunRecord(
        run=run_dir.name,
        stage=relative[0] if len(relative) > 1 else None,
        preset=_size_of(run_dir.name, recipe, sizes, shapes),
        parameters=result.get("parameters"),
        lr=opt.get("lr"),
        weight_decay=opt.get("weight_decay"),
        beta2=opt.get("beta2"),
        loss=loss if math.isfinite(loss) else None,
        tokens=result.get("tokens"),
        median_tokens_per_second=median,
        peak_memory_bytes=int(peak) if _number(peak) and peak > 0 else None,
        status=str(result.get("status", "complete")),
        recipe=recipe,
        curve=subset_curve(metrics),
    )


def collect_runs(runs_dir: str | Path) -> list[RunRecord]:
    """Every run under ``runs_dir`` with a result.json, in stage-then-rank order."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise DataError(f"runs directory not found: {root}")
    found = sorted(p.parent for p in root.rglob("result.json"))
    if not found:
        raise DataError(f"no finished runs (result.json) under {root}; train some runs first")
    sizes, shapes = _campaign_sizes(root), _preset_shapes()
    records = [load_run(d, root, sizes, shapes) for d in found]
    return sorted(records, key=RunRecord.sort_key)


# ----------------------------------------------------------------------------- writing


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "loss":
        return f"{value:.6f}"
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "gib":
        return f"{value / GIB:.2f}"
    return f"{value:.6g}"


def table_cells(row: dict[str, Any]) -> list[str]:
    """One report.md table row from one comparison.json row."""
    return [
        row["run"],
        _fmt(row["parameters"], "int"),
        _fmt(row["lr"], "num"),
        _fmt(row["weight_decay"], "num"),
        _fmt(row["beta2"], "num"),
        _fmt(row["loss"], "loss"),
        _fmt(row["tokens"], "int"),
        _fmt(row["median_tokens_per_second"], "rate"),
        _fmt(row["peak_memory_bytes"], "gib"),
    ]


def best_per_size(records: list[RunRecord]) -> dict[str, RunRecord]:
    """Size -> its best run with a final loss, sizes in the order they first appear."""
    best: dict[str, RunRecord] = {}
    for rec in records:
        if rec.loss is not None and (
            rec.preset not in best or rec.sort_key()[1] < best[rec.preset].sort_key()[1]
        ):
            best[rec.preset] = rec
    return best


def markdown(records: list[RunRecord], best: dict[str, RunRecord]) -> str:
    lines = ["# Run comparison", ""]
    lines.append(
        "Final loss = full validation loss after the last epoch (nats per token); "
        "Median tok/s = median of the logged training windows; rows by stage, then rank."
    )
    lines += ["", "| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(table_cells(r.row())) + " |" for r in records]
    diverged = [r.run for r in records if r.status == "diverged"]
    if diverged:
        lines += ["", f"Diverged (non-finite loss; ranked last): {', '.join(diverged)}."]
    lines += ["", "## Best run per size", ""]
    for size, rec in best.items():
        lines.append(f"- {size}: `{rec.run}` (loss {_fmt(rec.loss, 'loss')}) -> `selected-{size}.yaml`")
    lines += ["", "![learning curves](learning-curves.png)", ""]
    return "\n".join(lines)


def plot_curves(records: list[RunRecord], path: Path) -> None:
    """Subset validation loss vs training tokens, one panel per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r.preset for r in records))
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.0 * len(sizes), 4.0), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for rec in (r for r in records if r.preset == size):
            if rec.curve:
                tokens, losses = zip(*rec.curve, strict=True)
                ax.plot(tokens, losses, marker=".", label=rec.run)
        ax.set_title(size)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("subset validation loss")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.render.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, tmp.read_bytes())
    tmp.unlink()


def selected_yaml(rec: RunRecord, size: str) -> str:
    """The best run's complete recipe, aimed at a fresh run directory (training it again must not collide)."""
    source = rec.recipe.get("runtime", {}).get("output_dir", rec.run)
    header = (
        f"# Best run for size {size}: {rec.run} (final validation loss {_fmt(rec.loss, 'loss')})\n"
        f"# trained in {source}\n"
    )
    recipe = {**rec.recipe}
    if isinstance(recipe.get("runtime"), dict):
        recipe["runtime"] = {**recipe["runtime"], "output_dir": f"runs/selected-{size}"}
    return header + yaml.safe_dump(recipe, sort_keys=False)


def write_report(runs_dir: str | Path, out_dir: str | Path, sizes: list[str] | None = None) -> dict[str, Any]:
    """Write all report files; ``sizes`` (if given) must each get a selected-<size>.yaml."""
    records = collect_runs(runs_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    best = best_per_size(records)
    missing = [s for s in sizes or [] if s not in best]
    if missing:
        raise DataError(
            f"no finished run with a final loss for size(s) {', '.join(missing)} under {runs_dir}"
        )
    rows = [r.row() for r in records]
    atomic_write_json(out / "comparison.json", rows)
    plot_curves(records, out / "learning-curves.png")
    for size, rec in best.items():
        atomic_write_text(out / f"selected-{size}.yaml", selected_yaml(rec, size))
    atomic_write_text(out / "report.md", markdown(records, best))
    return {"runs": len(rows), "best": {size: rec.run for size, rec in best.items()}, "output_dir": str(out)}
