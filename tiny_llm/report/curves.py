"""The report's learning curves: per size, training and subset validation loss against training tokens,
one line per configuration (the mean of its seeds, their range as a band), labelled by what differs."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from tiny_llm.report.records import ConfigurationRecord, RunRecord, group_configurations
from tiny_llm.report.tables import fmt

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
    r"runtime\.(?!seed$).*|data\.(cache_dir|prefetch|buffer_size_mib|tokenize_batch_size|prepare_workers)|evaluation\..*"
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
        return fmt(value, "num")
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


def mean_curve(
    curves: list[list[tuple[int, float]]],
) -> tuple[list[int], list[float], list[float], list[float]]:
    """(tokens, mean, min, max) over ``curves`` at every token count any of them logged (a seed that stopped
    early, e.g. diverged, leaves the mean of the others from there on)."""
    by_token: dict[int, list[float]] = {}
    for curve in curves:
        for count, loss in curve:
            by_token.setdefault(count, []).append(loss)
    tokens = sorted(by_token)
    return (
        tokens,
        [statistics.fmean(by_token[t]) for t in tokens],
        [min(by_token[t]) for t in tokens],
        [max(by_token[t]) for t in tokens],
    )


def _series_labels(configurations: list[ConfigurationRecord]) -> dict[str, str]:
    """Configuration id -> legend label: what differs between their first runs (their seeds are alike)."""
    labels = run_labels([c.first for c in configurations])
    out = {}
    for c in configurations:  # nothing tells them apart: the configuration's id, not its first run's
        label = labels[c.first.run]
        out[c.configuration] = c.configuration if label == c.first.run else label
    return out


def _panel_title(size: str, configurations: list[ConfigurationRecord]) -> str:
    seeds = {len(c.members) for c in configurations}
    if seeds == {1} or not seeds:
        return f"{size} ({len(configurations)} run{'s' if len(configurations) != 1 else ''})"
    per = f"{seeds.pop()} seeds" if len(seeds) == 1 else "several seeds"
    many = "s" if len(configurations) != 1 else ""
    return f"{size} ({len(configurations)} configuration{many} × {per}: mean, band = range)"


def draw_curves(records: list[RunRecord]) -> Any:
    """Per size a row of two panels, training loss of the logged windows and subset validation loss, against
    training tokens; one line per configuration (the mean of its seeds, their range as a band), the legend
    beside the row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import compact_axis, line_styles

    configurations = group_configurations(records)
    sizes = list(dict.fromkeys(r.preset for r in records))
    fig, axes = plt.subplots(
        len(sizes), 2, figsize=(13.0, 4.2 * len(sizes)), squeeze=False, layout="constrained"
    )
    for (train_ax, val_ax), size in zip(axes, sizes, strict=True):
        plotted = [c for c in configurations if c.preset == size and any(m.curve for m in c.members)]
        labels = _series_labels(plotted)
        for c, style in zip(plotted, line_styles(len(plotted)), strict=True):
            band = len(c.members) > 1
            train = mean_curve([m.train_curve for m in c.members])
            if train[0]:
                line = {k: style[k] for k in ("color", "linestyle")}
                train_ax.plot(train[0], train[1], linewidth=1.1, **line)
                if band:
                    train_ax.fill_between(train[0], train[2], train[3], color=style["color"], alpha=0.15)
            tokens, mean, low, high = mean_curve([m.curve for m in c.members])
            val_ax.plot(tokens, mean, label=labels[c.configuration], **style)
            if band:
                val_ax.fill_between(tokens, low, high, color=style["color"], alpha=0.18)
        title = _panel_title(size, plotted)
        train_ax.set_title(f"{title}\ntraining loss (logged windows)", fontsize=10)
        val_ax.set_title(f"{title}\nsubset validation loss (every epoch)", fontsize=10)
        train_ax.set_ylabel("loss (nats/token)")
        for ax in (train_ax, val_ax):
            ax.set_xlabel("training tokens")
            compact_axis(ax.xaxis)
            ax.grid(alpha=0.3)
        if plotted:
            val_ax.legend(fontsize=8.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def plot_curves(records: list[RunRecord], path: Path) -> None:
    """Write draw_curves' figure to ``path`` (PNG)."""
    from tiny_llm.plotting import save_png

    save_png(draw_curves(records), path)
