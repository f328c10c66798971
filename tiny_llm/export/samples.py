"""Report tables of exported models and their sample continuations (torch-free).

``write_samples_report(export_dirs, out_dir)`` reads each directory's ``tiny_llm_export.json`` and writes:

- ``models.html``: one row per exported model (loss, tokens, weights, directory) as a standalone page;
- ``samples.html``: for every prompt, each model's continuation;
- ``exports.md``: both as Markdown;
- ``exports.json``: the model rows as JSON.
"""

from __future__ import annotations

import re
from html import escape
from pathlib import Path
from typing import Any

from tiny_llm.errors import DataError
from tiny_llm.export.card import EXPORT_FILE, EXPORT_FORMAT
from tiny_llm.io import atomic_write_json, atomic_write_text, read_json
from tiny_llm.output_dirs import check_output_dir, claim_output_dir
from tiny_llm.report.tables import TABLE_CSS

MODEL_HEADER = ("Model", "Parameters", "Weights", "Tokens", "Final loss", "dtype", "Directory")
SAMPLES_CSS = """
td.text { white-space: normal; max-width: 60em; }
td.text b { color: #555; }
td.stop { color: #777; }
"""
LOSS_NOTE = (
    "Final loss = full validation loss of the run (nats per token; of the workers' average for a packed run, "
    "also when one worker is exported)."
)


def load_export(directory: str | Path) -> dict[str, Any]:
    """An export directory's facts, with ``directory`` added."""
    directory = Path(directory)
    file = directory / EXPORT_FILE
    if not file.is_file():
        raise DataError(
            f"{directory} is not a tiny-llm export (no {EXPORT_FILE}); run `tiny-llm export` first"
        )
    meta = read_json(file)
    if not isinstance(meta, dict) or meta.get("format") != EXPORT_FORMAT:
        raise DataError(f"{file}: not a tiny-llm export description")
    return {**meta, "directory": str(directory)}


def model_row(meta: dict[str, Any]) -> dict[str, Any]:
    training = meta.get("training") or {}
    return {
        "model": meta["name"],
        "parameters": meta["parameters"],
        "weights": meta["weights"],
        "tokens": training.get("tokens"),
        "final_loss": training.get("final_validation_loss"),
        "validation_complete": training.get("validation_complete"),
        "dtype": meta["dtype"],
        "directory": meta["directory"],
    }


def _cells(row: dict[str, Any]) -> list[str]:
    loss = row["final_loss"]
    loss_text = (
        "-" if loss is None else f"{loss:.4f}" + ("" if row["validation_complete"] is not False else "*")
    )
    tokens = "-" if row["tokens"] is None else f"{row['tokens']:,}"
    return [
        row["model"],
        f"{row['parameters']:,}",
        row["weights"],
        tokens,
        loss_text,
        row["dtype"],
        row["directory"],
    ]


def _sampling_text(settings: dict[str, Any]) -> str:
    if settings["temperature"] == 0:
        return f"greedy, up to {settings['max_new_tokens']} new tokens"
    return (
        f"temperature {settings['temperature']:g}, top-k {settings['top_k']}, top-p {settings['top_p']:g}, "
        f"seed {settings['seed']} + prompt index, up to {settings['max_new_tokens']} new tokens"
    )


def prompt_table(exports: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """[(prompt, [(model, sample item)])] in first-seen prompt order."""
    order: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for meta in exports:
        for item in (meta.get("samples") or {}).get("items", []):
            order.setdefault(item["prompt"], []).append((meta["name"], item))
    return list(order.items())


def models_html(rows: list[dict[str, Any]]) -> str:
    numeric = [False, True, False, True, True, False, False]
    head = "".join(
        f'<th class="num">{escape(h)}</th>' if num else f"<th>{escape(h)}</th>"
        for h, num in zip(MODEL_HEADER, numeric, strict=True)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{escape(c)}</td>' if num else f"<td>{escape(c)}</td>"
            for c, num in zip(_cells(row), numeric, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    incomplete = any(r["validation_complete"] is False for r in rows)
    note = LOSS_NOTE + (" *: on a truncated validation split." if incomplete else "")
    return _page(
        "Exported models",
        [
            f'<p class="note">{escape(note)} Each directory loads with transformers\' '
            "<code>AutoModelForCausalLM.from_pretrained</code> and "
            "<code>AutoTokenizer.from_pretrained</code>.</p>",
            f"<table><thead><tr>{head}</tr></thead><tbody>",
            *body,
            "</tbody></table>",
        ],
    )


def samples_html(exports: list[dict[str, Any]]) -> str:
    parts = []
    settings = {
        _sampling_text(meta["samples"]["settings"]) for meta in exports if meta.get("samples") is not None
    }
    if settings:
        parts.append(
            f'<p class="note">Continuations by tiny-llm\'s generate ({escape("; ".join(sorted(settings)))}); '
            "the prompt in bold. Stop: eos (the model ended the document), length or context.</p>"
        )
    else:
        parts.append('<p class="note">No exported model was sampled (export without --prompts).</p>')
    for prompt, entries in prompt_table(exports):
        parts.append(f"<h2>{escape(prompt)}</h2>")
        parts.append("<table><thead><tr><th>Model</th><th>Continuation</th><th>Stop</th></tr></thead><tbody>")
        for name, item in entries:
            parts.append(
                f'<tr><td>{escape(name)}</td><td class="text"><b>{escape(prompt)}</b>'
                f'{escape(item["completion"])}</td><td class="stop">{escape(item["stop_reason"])}</td></tr>'
            )
        parts.append("</tbody></table>")
    return _page("Sample continuations", parts, extra_css=SAMPLES_CSS)


def _page(title: str, body: list[str], extra_css: str = "") -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            f'<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>',
            f"<style>{TABLE_CSS}{extra_css}</style></head><body>",
            f"<h1>{escape(title)}</h1>",
            *body,
            "</body></html>",
            "",
        ]
    )


def _md_escape(text: str) -> str:
    """One table cell: pipes escaped, every whitespace run one space (a leading space kept)."""
    return re.sub(r"\s+", " ", text.replace("|", "\\|"))


def markdown(rows: list[dict[str, Any]], exports: list[dict[str, Any]]) -> str:
    lines = ["# Exported models", "", "| " + " | ".join(MODEL_HEADER) + " |"]
    lines.append("|" + "|".join(["---", "---:", "---", "---:", "---:", "---", "---"]) + "|")
    lines += ["| " + " | ".join(_md_escape(c) for c in _cells(row)) + " |" for row in rows]
    lines += ["", LOSS_NOTE, "", "# Sample continuations"]
    for prompt, entries in prompt_table(exports):
        lines += ["", f"## {prompt}", "", "| Model | Continuation | Stop |", "|---|---|---|"]
        for name, item in entries:
            text = f"**{_md_escape(prompt)}**{_md_escape(item['completion'])}"
            lines.append(f"| {name} | {text} | {item['stop_reason']} |")
    return "\n".join(lines) + "\n"


def write_samples_report(export_dirs: list[str | Path], out_dir: str | Path) -> dict[str, Any]:
    """Write models.html, samples.html, exports.md and exports.json for the given export directories."""
    if not export_dirs:
        raise DataError("no export directories given")
    check_output_dir(out_dir, "--output-dir")
    exports = [load_export(d) for d in export_dirs]
    rows = [model_row(meta) for meta in exports]
    out = claim_output_dir(out_dir, "--output-dir")
    atomic_write_json(out / "exports.json", rows)
    atomic_write_text(out / "exports.md", markdown(rows, exports))
    atomic_write_text(out / "models.html", models_html(rows))
    atomic_write_text(out / "samples.html", samples_html(exports))
    prompts = len(prompt_table(exports))
    return {"models": len(rows), "prompts": prompts, "output_dir": str(out)}
