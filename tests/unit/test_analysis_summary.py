"""`analysis-summary` (torch-free): summary.csv rows, manifest, figures, and clear errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tiny_llm.analysis.summary import COLUMNS, FIGURES, write_summary
from tiny_llm.cli import main
from tiny_llm.errors import DataError


def fake_result(root: Path, run: str, checkpoint: str, step: int, case: str, *, packed: bool = False) -> Path:
    """A job directory holding a result.json shaped like analyze's."""
    scale = 1.0 / (1 + step)
    stats = {
        "noise_samples": 4,
        "random_samples": 2,
        "dimension": 1000,
        "noise_alignment": 0.5 * scale,
        "normalized_noise_alignment": 2.0 * scale * (1.2 if case == "unseen" else 1.0),
        "average_noise_norm": 0.3 * scale,
        "average_batch_gradient_norm": 0.4 * scale,
        "mean_gradient_norm": 0.1 * scale,
        "normalized_random_alignment": 0.01,
        "alignment_ratio": 200.0 * scale,
    }
    if packed:
        stats.update(
            consensus_workers=4,
            consensus_alignment=0.2 * scale,
            normalized_consensus_alignment=-0.5 if step == 10 else 0.5 * scale,
            average_consensus_norm=0.05,
        )
    result = {
        "format": "tiny-llm-analysis",
        "version": 2,
        "identity": f"{run}-{checkpoint}-{case}",
        "run": f"results/runs/{run}",
        "checkpoint": {
            "name": checkpoint,
            "file": f"{checkpoint}.pt",
            "step": step,
            "epoch": step // 10,
            "tokens": step * 4096,
        },
        "case": case,
        "epoch_loss": 5.0 - step / 100,
        "statistics": stats,
        "seconds": 3.5,
    }
    job = root / run / checkpoint / case
    job.mkdir(parents=True)
    (job / "result.json").write_text(json.dumps(result))
    return job


@pytest.mark.slow
def test_summary_has_one_row_per_checkpoint_and_case_and_draws_every_figure(tmp_path: Path) -> None:
    jobs = [
        fake_result(tmp_path, "demo-s", f"epoch-{e:03d}", 10 * e, case, packed=True)
        for e in (3, 1, 2)
        for case in ("unseen", "seen")
    ]
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"event": "train", "step": s, "grad_norm": 1.0 / s} for s in range(2, 32, 2)]
    rows.append({"event": "validation", "step": 10, "loss": 5.0})
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    manifest = write_summary(jobs, tmp_path / "summary", metrics)
    table = list(csv.DictReader((tmp_path / "summary" / "summary.csv").open()))
    assert [(r["checkpoint"], r["case"]) for r in table] == [
        (f"epoch-00{e}", case) for e in (1, 2, 3) for case in ("seen", "unseen")
    ]
    assert tuple(table[0]) == COLUMNS and table[0]["run"] == "demo-s" and table[0]["step"] == "10"
    assert float(table[0]["normalized_noise_alignment"]) == pytest.approx(2.0 / 11)
    assert table[0]["consensus_workers"] == "4"
    assert manifest["rows"] == 6 and manifest["files"] == ["summary.csv", *FIGURES]
    assert [i["path"] for i in manifest["inputs"]] == [str(j) for j in jobs]
    for name in FIGURES:
        png = tmp_path / "summary" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # the identity follows the inputs, not their order
    again = write_summary(list(reversed(jobs)), tmp_path / "again")
    assert again["identity"] == manifest["identity"]


def test_a_plain_run_without_metrics_and_the_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    jobs = [fake_result(tmp_path, "run", "final", 100, case) for case in ("seen", "unseen")]
    out = tmp_path / "out"
    code = main(["analysis-summary", "--inputs", *map(str, jobs), "--output-dir", str(out)])
    done = capsys.readouterr()
    assert code == 0, done.err
    assert json.loads(done.out)["rows"] == 2
    assert "consensus_workers" in (out / "summary.csv").read_text().splitlines()[0]
    assert all((out / name).is_file() for name in FIGURES)


def test_unfinished_or_duplicate_inputs_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    job = fake_result(tmp_path, "run", "final", 100, "seen")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    with pytest.raises(
        DataError, match=r"unfinished/result\.json: not a finished analysis \(run analyze first\)"
    ):
        write_summary([job, unfinished], tmp_path / "out")
    with pytest.raises(DataError, match="both analyse run/final/seen"):
        write_summary([job, job / "result.json"], tmp_path / "out")
    code = main(["analysis-summary", "--inputs", str(unfinished), "--output-dir", "x"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1


def test_the_norms_legend_sits_below_the_axes_which_keep_the_width(tmp_path: Path) -> None:
    """Seven long entries beside the axes took half the figure's width; below them, the axes keep it."""
    import matplotlib.pyplot as plt

    from tiny_llm.analysis.summary import draw_norms, load_result, summary_rows

    jobs = [
        fake_result(tmp_path, "demo-s", f"epoch-{e:03d}", 10 * e, c)
        for e in (1, 2)
        for c in ("seen", "unseen")
    ]
    fig = draw_norms(summary_rows([load_result(job) for job in jobs]), [(5, 0.5), (15, 0.4)])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (axes,), (legend,) = fig.axes, fig.legends
    box, key = axes.get_window_extent(renderer), legend.get_window_extent(renderer)
    plt.close(fig)
    assert key.y1 < box.y0 and box.width > 0.8 * fig.bbox.width
