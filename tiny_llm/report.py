"""Comparison report of finished training runs (torch-free; matplotlib for the plot).

``write_report(runs_dir, out_dir)`` finds every run directory with a
``result.json`` under ``runs_dir`` and writes:

- ``comparison.json``: one row per run {kind "run", run, stage, preset, parameters, lr,
  weight_decay, beta2, loss, tokens, median_tokens_per_second, peak_memory_bytes, beta1, seed,
  configuration, status}; for a campaign (a ``campaign.json`` in ``runs_dir``) also one row per
  configuration {kind "configuration", loss_mean, loss_sd (sample SD, null for one seed), n, runs, seeds,
  diverged, ...};
- ``report.md``: the runs as a Markdown table, and where configurations have several seeds a table of
  configurations with their final loss as mean ± SD;
- ``table.html``: those tables as a standalone HTML page (the Snakemake HTML report shows it rendered);
- ``learning-curves.png``: per size, the training loss of the logged windows and the subset validation
  loss vs training tokens; a configuration with several seeds is drawn as their mean with the seeds'
  range as a band;
- ``selected-<size>.yaml``: the complete recipe of each size's best configuration (its first seed's run).

Rows are ordered by stage, then by the rank of their configuration (mean final full-validation loss over
its seeds; a diverged seed counts as the worst loss; ties -> lower lr, weight decay, beta1, beta2), the
order the campaign promotes in, then by seed.
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

from tiny_llm.campaign import (
    ConfigurationOutcome,
    RunOutcome,
    configuration_key,
    final_loss,
    loss_summary,
)
from tiny_llm.errors import REBUILD_CAMPAIGN, REBUILD_RESULT, DataError
from tiny_llm.io import atomic_write_json, atomic_write_text, is_replaced_run, read_json_mapping, read_yaml

GIB = 1024**3
TABLE_HEADER = ("Run", "Parameters", "LR", "Decay", "β2", "Final loss", "Tokens", "Median tok/s", "Peak GiB")
CONFIG_HEADER = (
    "Configuration", "Seeds", "Parameters", "LR", "Decay", "β1", "β2", "Final loss (mean ± SD)", "Tokens",
    "Median tok/s", "Peak GiB",
)  # fmt: skip
CONFIG_NOTE = (
    "One row per configuration: its final losses over the seeds as mean ± sample SD (one seed: no SD); a "
    "seed that diverged counts as the worst loss, so its configuration ranks after every one whose seeds "
    "all finished. Median tok/s: the median of its runs' medians; Peak GiB: their largest peak."
)
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
    """(training tokens, subset validation loss) after every epoch."""
    train_curve: list[tuple[int, float]] = field(default_factory=list, repr=False)
    """(training tokens, training loss of the logged window) of every train row."""
    beta1: float | None = None
    seed: int | None = None
    configuration: str = ""
    """The campaign configuration the run is a seed of ('' = a configuration of its own)."""

    @property
    def configuration_id(self) -> str:
        return self.configuration or self.run

    def row(self) -> dict[str, Any]:
        keys = ("run", "stage", "preset", "parameters", "lr", "weight_decay", "beta2", "loss", "tokens")
        out: dict[str, Any] = {"kind": "run", **{k: getattr(self, k) for k in keys}}
        out["median_tokens_per_second"] = self.median_tokens_per_second
        out["peak_memory_bytes"] = self.peak_memory_bytes
        out["beta1"] = self.beta1
        out["seed"] = self.seed
        out["configuration"] = self.configuration_id
        out["status"] = self.status
        return out

    def outcome(self) -> RunOutcome:
        inf = math.inf
        return RunOutcome(
            self.run,
            self.loss if self.loss is not None else inf,
            self.lr if self.lr is not None else inf,
            self.weight_decay if self.weight_decay is not None else inf,
            self.beta2 if self.beta2 is not None else inf,
            self.beta1 if self.beta1 is not None else inf,
            self.configuration_id,
            self.seed,
        )


@dataclass
class ConfigurationRecord:
    """The runs (one per seed) of one configuration of a stage, as the report aggregates them."""

    configuration: str
    stage: str | None
    preset: str
    members: list[RunRecord]
    """Its runs, by seed."""
    rank: int = 0
    """Rank within its stage (0 = best)."""

    def outcome(self) -> ConfigurationOutcome:
        return ConfigurationOutcome(self.configuration, tuple(m.outcome() for m in self.members))

    @property
    def first(self) -> RunRecord:
        return self.members[0]

    @property
    def mean(self) -> float | None:
        return loss_summary([m.outcome().loss for m in self.members])[0]

    @property
    def sd(self) -> float | None:
        return loss_summary([m.outcome().loss for m in self.members])[1]

    @property
    def diverged(self) -> list[str]:
        return [m.run for m in self.members if m.loss is None]

    def row(self) -> dict[str, Any]:
        rates = [m.median_tokens_per_second for m in self.members if m.median_tokens_per_second is not None]
        peaks = [m.peak_memory_bytes for m in self.members if m.peak_memory_bytes is not None]
        first = self.first
        return {
            "kind": "configuration",
            "configuration": self.configuration,
            "stage": self.stage,
            "preset": self.preset,
            "rank": self.rank,
            "parameters": first.parameters,
            "lr": first.lr,
            "weight_decay": first.weight_decay,
            "beta1": first.beta1,
            "beta2": first.beta2,
            "loss_mean": self.mean,
            "loss_sd": self.sd,
            "n": len(self.members),
            "runs": [m.run for m in self.members],
            "seeds": [m.seed for m in self.members],
            "losses": [m.loss for m in self.members],
            "diverged": self.diverged,
            "tokens": first.tokens,
            "median_tokens_per_second": float(statistics.median(rates)) if rates else None,
            "peak_memory_bytes": max(peaks) if peaks else None,
        }


def _stage_order(stage: str | None) -> tuple[int, str]:
    match = re.fullmatch(r"stage(\d+)", stage or "")
    return (int(match.group(1)), "") if match else (10**9, stage or "")


# ----------------------------------------------------------------------------- reading


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a line that is not a JSON object (torn by a crash, damaged) is skipped."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
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


def train_curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(training tokens, training loss of the logged window) of every train row (dense, between epochs)."""
    points = {}
    for r in rows:
        if r.get("event") == "train" and _number(r.get("tokens")) and _number(r.get("loss")):
            points[int(r["tokens"])] = float(r["loss"])
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


def _campaign_configurations(runs_dir: Path) -> dict[str, str]:
    """Run id -> its configuration, from a campaign.json (campaigns planned before seeds: none)."""
    record = runs_dir / "campaign.json"
    if not record.is_file():
        return {}
    members = {}
    for stage in read_json_mapping(record, REBUILD_CAMPAIGN).get("stages", []):
        for configuration, runs in (stage.get("configurations") or {}).items():
            members.update(dict.fromkeys(runs, configuration))
    return members


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


def load_run(
    run_dir: Path,
    runs_dir: Path,
    sizes: dict[str, str],
    shapes: dict[tuple, str],
    configurations: dict[str, str] | None = None,
) -> RunRecord:
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
        train_curve=train_curve(metrics),
        beta1=opt.get("beta1"),
        seed=(recipe.get("runtime") or {}).get("seed"),
        configuration=(configurations or {}).get(run_dir.name, ""),
    )


def collect_runs(runs_dir: str | Path) -> list[RunRecord]:
    """Every run under ``runs_dir`` with a result.json, ordered by stage, configuration rank, then seed."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise DataError(f"runs directory not found: {root}")
    found = sorted(p.parent for p in root.rglob("result.json") if not is_replaced_run(p.parent))
    if not found:
        raise DataError(f"no finished runs (result.json) under {root}; train some runs first")
    sizes, shapes, members = _campaign_sizes(root), _preset_shapes(), _campaign_configurations(root)
    records = [load_run(d, root, sizes, shapes, members) for d in found]
    return [m for c in group_configurations(records) for m in c.members]


def _seed_order(rec: RunRecord) -> tuple:
    return (rec.seed is not None, rec.seed if rec.seed is not None else 0, rec.run)


def group_configurations(records: list[RunRecord]) -> list[ConfigurationRecord]:
    """Runs grouped by (stage, configuration), ranked within each stage, stages in order; members by seed."""
    groups: dict[tuple[str | None, str], list[RunRecord]] = {}
    for rec in records:
        groups.setdefault((rec.stage, rec.configuration_id), []).append(rec)
    configurations = [
        ConfigurationRecord(cid, stage, members[0].preset, sorted(members, key=_seed_order))
        for (stage, cid), members in groups.items()
    ]
    configurations.sort(key=lambda c: (_stage_order(c.stage), configuration_key(c.outcome())))
    ranks: dict[str | None, int] = {}
    for c in configurations:
        c.rank = ranks.get(c.stage, 0)
        ranks[c.stage] = c.rank + 1
    return configurations


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


def config_cells(row: dict[str, Any]) -> list[str]:
    """One row of the configuration table from one comparison.json configuration row."""
    if row["diverged"]:
        loss = f"diverged ({len(row['diverged'])} of {row['n']} seeds)"
    elif row["loss_sd"] is None:
        loss = _fmt(row["loss_mean"], "loss")
    else:
        loss = f"{_fmt(row['loss_mean'], 'loss')} ± {_fmt(row['loss_sd'], 'loss')}"
    seeds = ", ".join("-" if s is None else str(s) for s in row["seeds"])
    return [
        row["configuration"],
        seeds,
        _fmt(row["parameters"], "int"),
        _fmt(row["lr"], "num"),
        _fmt(row["weight_decay"], "num"),
        _fmt(row["beta1"], "num"),
        _fmt(row["beta2"], "num"),
        loss,
        _fmt(row["tokens"], "int"),
        _fmt(row["median_tokens_per_second"], "rate"),
        _fmt(row["peak_memory_bytes"], "gib"),
    ]


def best_per_size(configurations: list[ConfigurationRecord]) -> dict[str, ConfigurationRecord]:
    """Size -> its best configuration whose seeds all have a final loss, sizes in order of appearance."""
    best: dict[str, ConfigurationRecord] = {}
    for c in configurations:
        if c.mean is None:
            continue
        if c.preset not in best or configuration_key(c.outcome()) < configuration_key(
            best[c.preset].outcome()
        ):
            best[c.preset] = c
    return best


def _seeded(configurations: list[ConfigurationRecord]) -> bool:
    """Whether any configuration has several runs (then the report shows the configuration table)."""
    return any(len(c.members) > 1 for c in configurations)


def _describe_best(c: ConfigurationRecord) -> str:
    if len(c.members) == 1:
        return f"`{c.first.run}` (loss {_fmt(c.mean, 'loss')})"
    spread = f" ± {_fmt(c.sd, 'loss')}" if c.sd is not None else ""
    return f"`{c.configuration}` (loss {_fmt(c.mean, 'loss')}{spread} over {len(c.members)} seeds)"


def _diverged_note(records: list[RunRecord], seeded: bool) -> str:
    diverged = [r.run for r in records if r.status == "diverged"]
    if not diverged:
        return ""
    if seeded:
        return (
            f"Diverged (non-finite loss; counted as the worst loss, so its configuration ranks after every "
            f"configuration whose seeds all finished): {', '.join(diverged)}."
        )
    return f"Diverged (non-finite loss; ranked last): {', '.join(diverged)}."


def markdown(
    records: list[RunRecord], configurations: list[ConfigurationRecord], best: dict[str, ConfigurationRecord]
) -> str:
    lines = ["# Run comparison", ""]
    seeded = _seeded(configurations)
    if seeded:
        lines += ["## Configurations (final loss: mean ± SD over seeds)", "", CONFIG_NOTE, ""]
        lines += ["| " + " | ".join(CONFIG_HEADER) + " |", "|" + "---|" * len(CONFIG_HEADER)]
        lines += ["| " + " | ".join(config_cells(c.row())) + " |" for c in configurations]
        lines += ["", "## Runs", ""]
    lines.append(TABLE_NOTE)
    lines += ["", "| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(table_cells(r.row())) + " |" for r in records]
    note = _diverged_note(records, seeded)
    if note:
        lines += ["", note]
    lines += ["", "## Best configuration per size" if seeded else "## Best run per size", ""]
    for size, c in best.items():
        lines.append(f"- {size}: {_describe_best(c)} -> `selected-{size}.yaml`")
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


def _html_table(
    header: tuple[str, ...],
    items: list[tuple[str | None, str, list[str]]],
    stages: bool,
) -> list[str]:
    """A table of (stage, row class, cells) items; a stage row before each stage when ``stages``."""
    numeric = [False] + [True] * (len(header) - 1)
    head = "".join(
        f'<th class="num">{escape(h)}</th>' if num else f"<th>{escape(h)}</th>"
        for h, num in zip(header, numeric, strict=True)
    )
    body = []
    current: object = object()
    for stage, kind, cells in items:
        if stages and stage != current:
            current = stage
            body.append(f'<tr class="stage"><td colspan="{len(header)}">{escape(stage or "-")}</td></tr>')
        tds = "".join(
            f'<td class="num">{escape(c)}</td>' if num else f"<td>{escape(c)}</td>"
            for c, num in zip(cells, numeric, strict=True)
        )
        body.append(f'<tr class="{kind}">{tds}</tr>' if kind else f"<tr>{tds}</tr>")
    return [f"<table><thead><tr>{head}</tr></thead><tbody>", *body, "</tbody></table>"]


def table_html(
    records: list[RunRecord], configurations: list[ConfigurationRecord], best: dict[str, ConfigurationRecord]
) -> str:
    """The report.md tables as a standalone HTML page (what the Snakemake HTML report embeds)."""
    seeded = _seeded(configurations)
    best_configurations = {(c.stage, c.configuration) for c in best.values()}
    best_runs = set() if seeded else {c.first.run for c in best.values()}
    stages = len({r.stage for r in records}) > 1
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Run comparison</title>',
        f"<style>{TABLE_CSS}</style></head><body>",
        "<h1>Run comparison</h1>",
    ]
    if seeded:
        items = []
        for c in configurations:
            kind = "best" if (c.stage, c.configuration) in best_configurations else ""
            items.append((c.stage, kind or ("diverged" if c.diverged else ""), config_cells(c.row())))
        parts.append("<h2>Configurations (final loss: mean ± SD over seeds)</h2>")
        parts.append(f'<p class="note">{escape(CONFIG_NOTE)} Bold: the best configuration of each size.</p>')
        parts += _html_table(CONFIG_HEADER, items, stages)
        parts.append("<h2>Runs</h2>")
    items = []
    for rec in records:
        kind = "best" if rec.run in best_runs else "diverged" if rec.status == "diverged" else ""
        items.append((rec.stage, kind, table_cells(rec.row())))
    extra = "" if seeded else " Bold: the best run of each size."
    parts.append(f'<p class="note">{escape(TABLE_NOTE)}{extra}</p>')
    parts += _html_table(TABLE_HEADER, items, stages)
    note = _diverged_note(records, seeded)
    if note:
        parts.append(f"<p>{escape(note)}</p>")
    parts.append(f"<h2>{'Best configuration per size' if seeded else 'Best run per size'}</h2><ul>")
    for size, c in best.items():
        text = _describe_best(c).replace("`", "")
        parts.append(
            f"<li>{escape(size)}: {escape(text)} &rarr; <code>selected-{escape(size)}.yaml</code></li>"
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


def mean_curve(
    curves: list[list[tuple[int, float]]],
) -> tuple[list[int], list[float], list[float], list[float]]:
    """(tokens, mean, min, max) over ``curves`` at every token count any of them logged (a seed that stopped
    early, e.g. diverged, leaves the mean of the others from there on)."""
    by_token: dict[int, list[float]] = {}
    for curve in curves:
        for tokens, loss in curve:
            by_token.setdefault(tokens, []).append(loss)
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


def selected_yaml(c: ConfigurationRecord, size: str) -> str:
    """The best configuration's complete recipe (its first seed's run), aimed at a fresh run directory
    (training it again must not collide)."""
    rec = c.first
    source = rec.recipe.get("runtime", {}).get("output_dir", rec.run)
    if len(c.members) == 1:
        header = f"# Best run for size {size}: {rec.run} (final validation loss {_fmt(rec.loss, 'loss')})\n"
    else:
        spread = f" ± {_fmt(c.sd, 'loss')}" if c.sd is not None else ""
        header = (
            f"# Best configuration for size {size}: {c.configuration} (final validation loss "
            f"{_fmt(c.mean, 'loss')}{spread} over {len(c.members)} seeds)\n"
            f"# the recipe of its run {rec.run} (seed {rec.seed})\n"
        )
    header += f"# trained in {source}\n"
    recipe = {**rec.recipe}
    if isinstance(recipe.get("runtime"), dict):
        recipe["runtime"] = {**recipe["runtime"], "output_dir": f"runs/selected-{size}"}
    return header + yaml.safe_dump(recipe, sort_keys=False)


def write_report(runs_dir: str | Path, out_dir: str | Path, sizes: list[str] | None = None) -> dict[str, Any]:
    """Write all report files; ``sizes`` (if given) must each get a selected-<size>.yaml."""
    records = collect_runs(runs_dir)
    configurations = group_configurations(records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    best = best_per_size(configurations)
    missing = [s for s in sizes or [] if s not in best]
    if missing:
        raise DataError(
            f"no finished run with a final loss for size(s) {', '.join(missing)} under {runs_dir}"
        )
    rows = [r.row() for r in records]
    if (Path(runs_dir) / "campaign.json").is_file():  # a campaign: one aggregate row per configuration
        rows += [c.row() for c in configurations]
    atomic_write_json(out / "comparison.json", rows)
    plot_curves(records, out / "learning-curves.png")
    for size, c in best.items():
        atomic_write_text(out / f"selected-{size}.yaml", selected_yaml(c, size))
    atomic_write_text(out / "report.md", markdown(records, configurations, best))
    atomic_write_text(out / "table.html", table_html(records, configurations, best))
    return {
        "runs": len(records),
        "configurations": len(configurations),
        "best": {size: c.configuration for size, c in best.items()},
        "output_dir": str(out),
    }
