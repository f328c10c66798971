"""The report's tables: report.md (Markdown) and table.html (HTML, with the CSS the export tables share)."""

from __future__ import annotations

from html import escape
from typing import Any

from tiny_llm.config import OptimizerLabel
from tiny_llm.report.records import ConfigurationRecord, RunRecord

GIB = 1024**3
TABLE_HEADER = (
    "Run", "Optimizer", "Parameters", "LR", "Decay", "β2", "Final loss", "bpb", "Tokens", "Median tok/s",
    "Peak GiB",
)  # fmt: skip
CONFIG_HEADER = (
    "Configuration", "Optimizer", "Seeds", "Parameters", "LR", "Decay", "β1", "β2", "Final loss (mean ± SD)",
    "bpb (mean)", "Tokens", "Median tok/s", "Peak GiB",
)  # fmt: skip
TEXT_COLUMNS = ("Run", "Configuration", "Optimizer", "Verdict", "Goes on")  # left-aligned in table.html
CONFIG_NOTE = (
    "One row per configuration: its final losses over the seeds as mean ± sample SD (one seed: no SD); a "
    "seed that diverged counts as the worst loss, so its configuration ranks after every one whose seeds "
    "all finished. Median tok/s: the median of its runs' medians; Peak GiB: their largest peak."
)
TABLE_NOTE = (
    "Final loss = full validation loss after the last epoch (nats per token); bpb = its bits per byte (the "
    "text targets' nats over ln 2 times their UTF-8 bytes, EOS left out: comparable across tokenizers); "
    "Median tok/s = median of the logged training windows, measured while other training jobs of the same "
    "workflow may share the machine (the tuning and packed benchmarks run alone); rows by stage, then rank."
)


def fmt(value: Any, kind: str) -> str:
    """A report cell: '-' for None, else by kind (int, loss, bpb, rate, gib, num)."""
    if value is None:
        return "-"
    if kind == "int":
        return f"{int(value):,}"
    if kind == "loss":
        return f"{value:.6f}"
    if kind == "bpb":
        return f"{value:.4f}"
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "gib":
        return f"{value / GIB:.2f}"
    return f"{value:.6g}"


def optimizer_cell(row: dict[str, Any]) -> str:
    """A comparison.json row's optimizer, as ``OptimizerLabel.text`` says it."""
    return OptimizerLabel(row["optimizer"], row["muon_lr"]).text()


def table_cells(row: dict[str, Any]) -> list[str]:
    """One report.md table row from one comparison.json row."""
    return [
        row["run"],
        optimizer_cell(row),
        fmt(row["parameters"], "int"),
        fmt(row["lr"], "num"),
        fmt(row["weight_decay"], "num"),
        fmt(row["beta2"], "num"),
        fmt(row["loss"], "loss"),
        fmt(row["bpb"], "bpb"),
        fmt(row["tokens"], "int"),
        fmt(row["median_tokens_per_second"], "rate"),
        fmt(row["peak_memory_bytes"], "gib"),
    ]


def config_cells(row: dict[str, Any]) -> list[str]:
    """One row of the configuration table from one comparison.json configuration row."""
    if row["diverged"]:
        loss = f"diverged ({len(row['diverged'])} of {row['n']} seeds)"
    elif row["loss_sd"] is None:
        loss = fmt(row["loss_mean"], "loss")
    else:
        loss = f"{fmt(row['loss_mean'], 'loss')} ± {fmt(row['loss_sd'], 'loss')}"
    seeds = ", ".join("-" if s is None else str(s) for s in row["seeds"])
    return [
        row["configuration"],
        optimizer_cell(row),
        seeds,
        fmt(row["parameters"], "int"),
        fmt(row["lr"], "num"),
        fmt(row["weight_decay"], "num"),
        fmt(row["beta1"], "num"),
        fmt(row["beta2"], "num"),
        loss,
        fmt(row["bpb_mean"], "bpb"),
        fmt(row["tokens"], "int"),
        fmt(row["median_tokens_per_second"], "rate"),
        fmt(row["peak_memory_bytes"], "gib"),
    ]


def _seeded(configurations: list[ConfigurationRecord]) -> bool:
    """Whether any configuration has several runs (then the report shows the configuration table)."""
    return any(len(c.members) > 1 for c in configurations)


def _describe_best(c: ConfigurationRecord) -> str:
    if len(c.members) == 1:
        return f"`{c.first.run}` (loss {fmt(c.mean, 'loss')})"
    spread = f" ± {fmt(c.sd, 'loss')}" if c.sd is not None else ""
    return f"`{c.configuration}` (loss {fmt(c.mean, 'loss')}{spread} over {len(c.members)} seeds)"


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
    records: list[RunRecord],
    configurations: list[ConfigurationRecord],
    best: dict[str, ConfigurationRecord],
    noise: list[str] | None = None,
) -> str:
    """report.md; ``noise``: the noise-floor section's lines, after the configurations (without seeds: after
    the runs)."""
    lines = ["# Run comparison", ""]
    seeded = _seeded(configurations)
    if seeded:
        lines += ["## Configurations (final loss: mean ± SD over seeds)", "", CONFIG_NOTE, ""]
        lines += ["| " + " | ".join(CONFIG_HEADER) + " |", "|" + "---|" * len(CONFIG_HEADER)]
        lines += ["| " + " | ".join(config_cells(c.row())) + " |" for c in configurations]
        lines += ["", *(noise or []), "## Runs", ""]
    lines.append(TABLE_NOTE)
    lines += ["", "| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(table_cells(r.row())) + " |" for r in records]
    note = _diverged_note(records, seeded)
    if note:
        lines += ["", note]
    if not seeded and noise:
        lines += ["", *noise]
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
tr.cut-noise td { border-bottom: 3px dashed #c0392b; }
tr.cut-holds td { border-bottom: 3px solid #2e8b57; }
p.note { color: #555; max-width: 60em; }
"""


def html_table(
    header: tuple[str, ...],
    items: list[tuple[str | None, str, list[str]]],
    stages: bool,
) -> list[str]:
    """A table of (stage, row class, cells) items; a stage row before each stage when ``stages``."""
    numeric = [h not in TEXT_COLUMNS for h in header]
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
    records: list[RunRecord],
    configurations: list[ConfigurationRecord],
    best: dict[str, ConfigurationRecord],
    noise: list[str] | None = None,
) -> str:
    """The report.md tables as a standalone HTML page (what the Snakemake HTML report embeds); ``noise``: the
    noise-floor section's HTML, after the configurations (without seeds: after the runs)."""
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
        parts += html_table(CONFIG_HEADER, items, stages)
        parts += noise or []
        parts.append("<h2>Runs</h2>")
    items = []
    for rec in records:
        kind = "best" if rec.run in best_runs else "diverged" if rec.status == "diverged" else ""
        items.append((rec.stage, kind, table_cells(rec.row())))
    extra = "" if seeded else " Bold: the best run of each size."
    parts.append(f'<p class="note">{escape(TABLE_NOTE)}{extra}</p>')
    parts += html_table(TABLE_HEADER, items, stages)
    note = _diverged_note(records, seeded)
    if note:
        parts.append(f"<p>{escape(note)}</p>")
    if not seeded:
        parts += noise or []
    parts.append(f"<h2>{'Best configuration per size' if seeded else 'Best run per size'}</h2><ul>")
    for size, c in best.items():
        text = _describe_best(c).replace("`", "")
        parts.append(
            f"<li>{escape(size)}: {escape(text)} &rarr; <code>selected-{escape(size)}.yaml</code></li>"
        )
    parts += ["</ul>", "</body></html>", ""]
    return "\n".join(parts)
