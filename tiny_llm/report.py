"""Comparison report of finished training runs (torch-free; matplotlib for the plot).

``write_report(runs_dir, out_dir)`` finds every run directory with a
``result.json`` under ``runs_dir`` and writes:

- ``comparison.json``: one row per run {run, stage, preset, parameters, lr,
  weight_decay, beta2, loss, tokens, median_tokens_per_second, peak_memory_bytes};
- ``report.md``: the same rows as a Markdown table;
- ``table.html``: that table as a standalone HTML page (the Snakemake HTML report shows it rendered);
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
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.campaign import RunOutcome, final_loss, rank_key
from tiny_llm.errors import REBUILD_CAMPAIGN, REBUILD_RESULT, DataError
from tiny_llm.io import atomic_write_json, atomic_write_text, read_json_mapping, read_yaml

GIB = 1024**3
TABLE_HEADER = ("Run", "Parameters", "LR", "Decay", "β2", "Final loss", "Tokens", "Median tok/s", "Peak GiB")
TABLE_NOTE = (
    "Final loss = full validation loss after the last epoch (nats per token); "
    "Median tok/s = median of the logged training windows, measured while other training jobs of the same "
    "workflow may share the machine (the tuning and packed benchmarks run alone); rows by stage, then rank."
)
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
    stages = read_json_mapping(record, REBUILD_CAMPAIGN).get("stages", [])
    return {run: stage["size"] for stage in stages for run in stage["runs"]}


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
    rebuild = f"rebuild it with `tiny-llm resolve --config <the recipe the run was trained with> > {path}`"
    data = read_yaml(path, rebuild)
    return data if isinstance(data, dict) else {}


def load_run(run_dir: Path, runs_dir: Path, sizes: dict[str, str], shapes: dict[tuple, str]) -> RunRecord:
    result = read_json_mapping(run_dir / "result.json", REBUILD_RESULT)
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
    lines.append(TABLE_NOTE)
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


TABLE_CSS = """
body { font-family: system-ui, sans-serif; font-size: 13px; margin: 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 0.25em 0.55em; border-bottom: 1px solid #ddd; }
td { white-space: nowrap; }
th { background: #f0f0f0; text-align: left; border-bottom: 2px solid #bbb; vertical-align: bottom; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.best td { font-weight: 600; }
tr.diverged td { color: #999; font-style: italic; }
tr.stage td { background: #fafafa; color: #555; font-weight: 600; border-bottom: 1px solid #bbb; }
p.note { color: #555; max-width: 60em; }
"""


def table_html(records: list[RunRecord], best: dict[str, RunRecord]) -> str:
    """The report.md table as a standalone HTML page (what the Snakemake HTML report embeds)."""
    best_runs = {rec.run for rec in best.values()}
    numeric = [False] + [True] * (len(TABLE_HEADER) - 1)
    head = "".join(
        f'<th class="num">{escape(h)}</th>' if num else f"<th>{escape(h)}</th>"
        for h, num in zip(TABLE_HEADER, numeric, strict=True)
    )
    body = []
    stages = {r.stage for r in records}
    current: object = object()
    for rec in records:
        if len(stages) > 1 and rec.stage != current:
            current = rec.stage
            body.append(
                f'<tr class="stage"><td colspan="{len(TABLE_HEADER)}">{escape(rec.stage or "-")}</td></tr>'
            )
        cells = "".join(
            f'<td class="num">{escape(c)}</td>' if num else f"<td>{escape(c)}</td>"
            for c, num in zip(table_cells(rec.row()), numeric, strict=True)
        )
        kind = "best" if rec.run in best_runs else "diverged" if rec.status == "diverged" else ""
        body.append(f'<tr class="{kind}">{cells}</tr>' if kind else f"<tr>{cells}</tr>")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Run comparison</title>',
        f"<style>{TABLE_CSS}</style></head><body>",
        "<h1>Run comparison</h1>",
        f'<p class="note">{escape(TABLE_NOTE)} Bold: the best run of each size.</p>',
        f"<table><thead><tr>{head}</tr></thead><tbody>",
        *body,
        "</tbody></table>",
    ]
    diverged = [r.run for r in records if r.status == "diverged"]
    if diverged:
        parts.append(f"<p>Diverged (non-finite loss; ranked last): {escape(', '.join(diverged))}.</p>")
    parts.append("<h2>Best run per size</h2><ul>")
    for size, rec in best.items():
        parts.append(
            f"<li>{escape(size)}: <code>{escape(rec.run)}</code> (loss {_fmt(rec.loss, 'loss')}) "
            f"&rarr; <code>selected-{escape(size)}.yaml</code></li>"
        )
    parts += ["</ul>", "</body></html>", ""]
    return "\n".join(parts)


# Recipe keys that tell runs apart in a legend, with their short names; other keys go by their last part.
SHORT_KEYS = {
    "optimizer.lr": "lr",
    "optimizer.weight_decay": "wd",
    "optimizer.beta1": "β1",
    "optimizer.beta2": "β2",
    "optimizer.lr_schedule": "schedule",
    "optimizer.warmup_fraction": "warmup",
    "training.tokens_per_parameter": "tokens/param",
    "decentralized.num_models": "N",
}
# Settings of where and how fast a run executes or is evaluated, not of what it learns (runtime.seed is kept).
IGNORED_KEYS = re.compile(
    r"runtime\.(?!seed$).*|data\.(cache_dir|prefetch|buffer_size_mib|tokenize_batch_size)|evaluation\..*"
)
MAX_LABEL_KEYS = 3


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def differing_keys(recipes: list[dict[str, Any]]) -> list[str]:
    """Dotted recipe keys whose value is not the same in all ``recipes`` (runtime placement ignored).

    The SHORT_KEYS come first, in their order (lr, wd, β1, β2, ...); other keys follow in recipe order.
    """
    flats = [_flatten(r) for r in recipes]
    keys = list(dict.fromkeys(k for flat in flats for k in flat))
    found = [k for k in keys if not IGNORED_KEYS.fullmatch(k) and len({repr(f.get(k)) for f in flats}) > 1]
    known = list(SHORT_KEYS)
    return sorted(found, key=lambda k: known.index(k) if k in known else len(known))


def _short_name(key: str) -> str:
    return SHORT_KEYS.get(key, key.rsplit(".", 1)[-1])


def _label_value(value: Any) -> str:
    if isinstance(value, float):
        return _fmt(value, "num")
    return "-" if value is None else str(value)


def run_labels(records: list[RunRecord]) -> dict[str, str]:
    """Run id -> legend label naming what differs between ``records`` ("lr=0.001, wd=0.1").

    Falls back to the run id when a recipe is missing, nothing differs, more than MAX_LABEL_KEYS keys
    differ, or two runs would get the same label.
    """
    ids = {r.run: r.run for r in records}
    if len(records) < 2 or not all(r.recipe for r in records):
        return ids
    keys = differing_keys([r.recipe for r in records])
    if not keys or len(keys) > MAX_LABEL_KEYS:
        return ids
    labels = {}
    for rec in records:
        flat = _flatten(rec.recipe)
        labels[rec.run] = ", ".join(f"{_short_name(k)}={_label_value(flat.get(k))}" for k in keys)
    return labels if len(set(labels.values())) == len(labels) else ids


def draw_curves(records: list[RunRecord]) -> Any:
    """Subset validation loss vs training tokens, one panel per size (two a row), each legend beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import compact_axis, line_styles

    sizes = list(dict.fromkeys(r.preset for r in records))
    cols = min(len(sizes), 2)  # two panels a row keep the figure readable at its natural size
    rows = math.ceil(len(sizes) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(sizes) :]:
        ax.remove()
    for ax, size in zip(axes.flat, sizes, strict=False):
        plotted = [r for r in records if r.preset == size and r.curve]
        labels = run_labels(plotted)
        for rec, style in zip(plotted, line_styles(len(plotted)), strict=True):
            tokens, losses = zip(*rec.curve, strict=True)
            ax.plot(tokens, losses, label=labels[rec.run], **style)
        ax.set_title(f"{size} ({len(plotted)} run{'s' if len(plotted) != 1 else ''})")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("subset validation loss (nats/token)")
        compact_axis(ax.xaxis)
        ax.grid(alpha=0.3)
        if plotted:
            ax.legend(fontsize=8.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def plot_curves(records: list[RunRecord], path: Path) -> None:
    """Write draw_curves' figure to ``path`` (PNG)."""
    from tiny_llm.plotting import save_png

    save_png(draw_curves(records), path)


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
    atomic_write_text(out / "table.html", table_html(records, best))
    return {"runs": len(rows), "best": {size: rec.run for size, rec in best.items()}, "output_dir": str(out)}
