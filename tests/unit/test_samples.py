"""`samples`: the report's tables of exported models and continuations, from tiny_llm_export.json alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny_llm.errors import DataError
from tiny_llm.export.card import EXPORT_FILE, EXPORT_FORMAT, model_card
from tiny_llm.export.runs import best_run_dir, run_inputs
from tiny_llm.export.samples import markdown, model_row, samples_html, write_samples_report

SETTINGS = {"max_new_tokens": 8, "temperature": 0.8, "top_k": 50, "top_p": 0.95, "seed": 0,
            "stop_at_eos": True, "document_start": True}  # fmt: skip


def fake_export(
    directory: Path, name: str, *, loss: float | None, complete: bool = True, samples=None
) -> Path:
    meta = {
        "format": EXPORT_FORMAT,
        "version": 1,
        "name": name,
        "parameters": 123456,
        "model": {
            "vocab_size": 512,
            "num_layers": 2,
            "width": 64,
            "num_heads": 4,
            "ffn_width": 172,
            "context_length": 64,
            "rope_theta": 10000.0,
            "norm_eps": 1e-5,
        },  # fmt: skip
        "recipe": {
            "lr": 0.003,
            "beta1": 0.9,
            "beta2": 0.95,
            "weight_decay": 0.1,
            "lr_schedule": "cosine",
            "warmup_fraction": 0.05,
            "batch_tokens": 1024,
            "tokens_per_parameter": 1.0,
            "seed": 42,
            "packed": None,
        },  # fmt: skip
        "recipe_identity": "r" * 64,
        "weights": "one model",
        "checkpoint": "runs/x/final.safetensors",
        "worker": None,
        "dtype": "float32",
        "training": None
        if loss is None
        else {
            "tokens": 26432,
            "final_validation_loss": loss,
            "validation_complete": complete,
            "validation_tokens": 1000,
        },  # fmt: skip
        "cache": {
            "identity": "c" * 64,
            "dataset": "corpus",
            "tokenizer": "tok",
            "tokenizer_revision": None,
            "vocab_size": 512,
            "eos_token_id": 2,
        },  # fmt: skip
        "tokenizer": {
            "backend": "tokenizers",
            "eos_token": "</s>",
            "eos_token_id": 2,
            "bos_token": "<s>",
            "bos_token_id": 1,
            "files": [],
            "dropped_special_token_template": False,
        },  # fmt: skip
        "samples": samples,
    }
    out = directory / name
    out.mkdir(parents=True)
    (out / EXPORT_FILE).write_text(json.dumps(meta))
    return out


def test_rows_escape_and_mark_what_is_missing(tmp_path):
    items = [{"prompt": "A <b> | c", "completion": " x & y\nz", "new_tokens": 3, "stop_reason": "eos"}]
    a = fake_export(tmp_path, "a", loss=3.25, samples={"settings": SETTINGS, "items": items})
    b = fake_export(tmp_path, "b", loss=None)
    c = fake_export(tmp_path, "c", loss=4.0, complete=False)
    summary = write_samples_report([a, b, c], tmp_path / "out")
    assert summary == {"models": 3, "prompts": 1, "output_dir": str(tmp_path / "out")}
    models = (tmp_path / "out" / "models.html").read_text()
    assert "3.2500" in models and "4.0000*" in models and "truncated validation split" in models
    html = (tmp_path / "out" / "samples.html").read_text()
    assert "A &lt;b&gt; | c" in html and "x &amp; y" in html and "<b>" not in html.replace("<b>A", "")
    md = (tmp_path / "out" / "exports.md").read_text()
    assert "A <b> \\| c** x & y z | eos |" in md
    assert model_row(json.loads((b / EXPORT_FILE).read_text()) | {"directory": str(b)})["final_loss"] is None
    assert "No exported model was sampled" in samples_html([])
    assert markdown([], []).startswith("# Exported models")


def test_model_card_without_result_and_samples(tmp_path):
    directory = fake_export(tmp_path, "m", loss=None)
    card = model_card(json.loads((directory / EXPORT_FILE).read_text()))
    assert "not recorded" in card and "## Samples" not in card and "c" * 64 in card


def test_missing_or_foreign_exports_are_one_line_errors(tmp_path):
    with pytest.raises(DataError, match="not a tiny-llm export"):
        write_samples_report([tmp_path], tmp_path / "out")
    (tmp_path / EXPORT_FILE).write_text("{}")
    with pytest.raises(DataError, match="not a tiny-llm export description"):
        write_samples_report([tmp_path], tmp_path / "out")
    with pytest.raises(DataError, match="no export directories"):
        write_samples_report([], tmp_path / "out")


def test_run_and_ranking_resolution(tmp_path):
    run = tmp_path / "stage1" / "20m-lr0.001"
    run.mkdir(parents=True)
    with pytest.raises(DataError, match="not a run directory"):
        run_inputs(run)
    (run / "resolved.yaml").write_text("{}")
    with pytest.raises(DataError, match="no final checkpoint"):
        run_inputs(run)
    (run / "final.pt").write_text("x")
    assert run_inputs(run) == (run / "resolved.yaml", run / "final.pt")
    (run / "final.safetensors").write_text("x")
    assert run_inputs(run)[1] == run / "final.safetensors"
    ranking = tmp_path / "stage1" / "ranking.json"
    ranking.write_text(
        json.dumps([{"rank": 1, "run": "b", "loss": 4.0}, {"rank": 0, "run": run.name, "loss": 3.0}])
    )
    assert best_run_dir(ranking) == run
    seeds = {"rank": 0, "run": run.name, "loss": None, "run_losses": [None, 3.1], "runs": ["x", run.name]}
    ranking.write_text(json.dumps([seeds]))  # a diverged seed: no mean, but the best seed has a loss
    assert best_run_dir(ranking) == run
    ranking.write_text(json.dumps([{"rank": 0, "run": "a", "loss": None}]))
    with pytest.raises(DataError, match="no run of the stage has a final loss"):
        best_run_dir(ranking)
    with pytest.raises(DataError, match="ranking not found"):
        best_run_dir(tmp_path / "nope.json")
