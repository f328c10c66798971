"""Report files from fake (but real-format) run directories."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import matplotlib
import pytest
import yaml

from tiny_llm.cli import main
from tiny_llm.config import load_recipe, recipe_to_dict
from tiny_llm.errors import DataError
from tiny_llm.report import write_report
from tiny_llm.report.curves import differing_keys, draw_curves, run_labels
from tiny_llm.report.records import collect_runs
from tiny_llm.report.tables import GIB, TABLE_HEADER, optimizer_cell, table_cells

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def make_run(
    root: Path, stage: str, run: str, *, loss, lr, wd=0.1, beta2=0.95, layers=2, rates=(100.0, 300.0, 200.0)
):
    run_dir = root / stage / run
    run_dir.mkdir(parents=True)
    recipe = recipe_to_dict(
        load_recipe(
            ["tiny"],
            [f"optimizer.lr={lr}", f"optimizer.weight_decay={wd}", f"optimizer.beta2={beta2}"]
            + [f"model.num_layers={layers}", f"runtime.output_dir={run_dir}"],
        )
    )
    (run_dir / "resolved.yaml").write_text(yaml.safe_dump(recipe))
    rows = [
        {
            "event": "train",
            "step": 5 * (i + 1),
            "tokens": 5120 * (i + 1),
            "tokens_per_second": r,
            "loss": loss + 2 - i,
        }
        for i, r in enumerate(rates)
    ]
    rows += [
        {"event": "validation", "split": "subset", "tokens": t, "loss": loss + 1.0 / t * 1e4}
        for t in (8192, 16384)
    ]
    rows += [{"event": "final_validation", "split": "full", "tokens": 16384, "loss": loss}]
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"event": "tra'  # a torn last line
    (run_dir / "metrics.jsonl").write_text(text)
    result = {
        "parameters": 100_000 * layers,
        "tokens": 16384,
        "final_validation": {"loss": loss, "split": "full", "bpb": loss * 0.375},
        "training_tokens_per_second": 999.0,
        "peak_memory_bytes": 3 * GIB // 2,
    }
    (run_dir / "result.json").write_text(json.dumps(result))
    return run_dir


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "campaign"
    make_run(root, "stage1", "s-lr0.001-wd0.1", loss=4.0, lr=1e-3)
    make_run(root, "stage1", "s-lr0.003-wd0.1", loss=4.0, lr=3e-3)  # tie: higher lr ranks second
    make_run(root, "stage1", "s-lr0.0003-wd0", loss=3.5, lr=3e-4, wd=0.0)
    make_run(root, "stage2", "m-parent0", loss=3.2, lr=3e-4, wd=0.0, beta2=0.99, layers=3, rates=(50.0,))
    make_run(root, "stage2", "m-parent1", loss=3.1, lr=1e-3, layers=3, rates=())
    (root / "stage1" / "ranking.json").write_text("[]")  # not a run: ignored
    diverged = make_run(root, "stage2", "m-parent2", loss=9.0, lr=3e-3, layers=3)
    (diverged / "result.json").write_text(
        json.dumps({"status": "diverged", "final_validation": None, "step": 3})
    )
    stages = [
        {"stage": "stage1", "size": "s", "runs": ["s-lr0.001-wd0.1", "s-lr0.003-wd0.1", "s-lr0.0003-wd0"]},
        {"stage": "stage2", "size": "m", "runs": ["m-parent0", "m-parent1", "m-parent2"]},
    ]
    for stage in stages:  # without seeds, each run is its own configuration (as `campaign plan` writes it)
        stage["configurations"] = {run: [run] for run in stage["runs"]}
    (root / "campaign.json").write_text(json.dumps({"stages": stages}))
    return root


def parse_table(markdown: str) -> list[list[str]]:
    """The first table of a Markdown text (the runs; the noise floor's tables follow it)."""
    text = markdown.splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("|"))
    end = next((i for i in range(start, len(text)) if not text[i].startswith("|")), len(text))
    lines = text[start:end]
    assert [c.strip() for c in lines[0].strip("|").split("|")] == list(TABLE_HEADER)
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_rows_are_ordered_by_stage_then_rank(runs):
    records = collect_runs(runs)
    assert [r.run for r in records] == [
        "s-lr0.0003-wd0",
        "s-lr0.001-wd0.1",
        "s-lr0.003-wd0.1",
        "m-parent1",
        "m-parent0",
        "m-parent2",
    ]
    first = records[0]
    assert (first.stage, first.preset, first.parameters, first.lr, first.weight_decay) == (
        "stage1",
        "s",
        200_000,
        3e-4,
        0.0,
    )
    assert first.median_tokens_per_second == 200.0  # median of the train rows, torn line ignored
    assert records[3].median_tokens_per_second == 999.0  # no train rows -> result.json's figure
    assert first.curve == [(8192, pytest.approx(3.5 + 1e4 / 8192)), (16384, pytest.approx(3.5 + 1e4 / 16384))]


def test_report_files_exist_parse_and_the_table_matches_comparison_json(runs, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", "--runs", str(runs), "--output-dir", str(out), "--require-size", "s"]) == 0
    assert json.loads(capsys.readouterr().out)["best"] == {"s": "s-lr0.0003-wd0", "m": "m-parent1"}
    everything = json.loads((out / "comparison.json").read_text())
    rows = [r for r in everything if r["kind"] == "run"]
    keys = ["kind", "run", "stage", "preset", "parameters", "lr", "weight_decay", "beta2", "loss", "tokens"]
    extra = ["beta1", "seed", "configuration", "status", "optimizer", "muon_lr", "bpb"]
    assert list(rows[0]) == keys + ["median_tokens_per_second", "peak_memory_bytes"] + extra
    # a campaign (campaign.json) also gets one aggregate row per configuration: here one seed each
    configurations = [r for r in everything if r["kind"] == "configuration"]
    assert [c["runs"] for c in configurations] == [[r["run"]] for r in rows]
    assert all(c["n"] == 1 and c["loss_sd"] is None for c in configurations)
    assert [c["loss_mean"] for c in configurations] == [r["loss"] for r in rows]
    report_md = (out / "report.md").read_text()
    assert "mean ± SD" not in report_md  # one seed per configuration: the runs table alone
    table = parse_table(report_md)
    assert len(table) == len(rows) == 6
    for cells, row in zip(table, rows, strict=True):
        assert cells[0] == row["run"] and cells[1] == "adamw"
        values = [None if c == "-" else float(c.replace(",", "")) for c in cells[2:]]
        peak = row["peak_memory_bytes"] / GIB if row["peak_memory_bytes"] else None
        expected = [row[k] for k in ("parameters", "lr", "weight_decay", "beta2", "loss", "bpb", "tokens")]
        expected += [row["median_tokens_per_second"], peak]
        tolerances = (0, 1e-9, 1e-9, 1e-9, 5e-7, 5e-5, 0, 0.5, 0.005)
        for got, want, tol in zip(values, expected, tolerances, strict=True):
            assert (got is None and want is None) or got == pytest.approx(want, abs=tol), (cells, row)
    # the diverged run ranks last in its stage, without a loss, and is named under the table
    assert rows[-1]["run"] == "m-parent2" and rows[-1]["loss"] is None
    assert "Diverged (non-finite loss; ranked last): m-parent2." in report_md
    png = (out / "learning-curves.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    selected = yaml.safe_load((out / "selected-m.yaml").read_text())
    assert selected["model"]["num_layers"] == 3 and selected["optimizer"]["lr"] == 1e-3
    assert selected["runtime"]["output_dir"] == "runs/selected-m"  # a fresh directory, not the campaign run's
    assert f"# trained in {runs / 'stage2' / 'm-parent1'}" in (out / "selected-m.yaml").read_text()
    assert load_recipe([str(out / "selected-s.yaml")]).optimizer.lr == 3e-4  # a usable recipe
    assert re.search(r"- s: `s-lr0.0003-wd0`", report_md)


def test_sizes_without_campaign_json_come_from_preset_shapes(runs, tmp_path):
    (runs / "campaign.json").unlink()
    presets = {r.run: r.preset for r in collect_runs(runs)}
    assert presets["s-lr0.001-wd0.1"] == "tiny"  # the tiny preset's exact shape
    assert presets["m-parent0"] == "3x64"  # no preset has it: layers x width


def test_missing_runs_or_required_size_are_clear_errors(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no finished runs"):
        collect_runs(empty)
    with pytest.raises(DataError, match="runs directory not found"):
        collect_runs(tmp_path / "nowhere")
    with pytest.raises(DataError, match="size\\(s\\) l"):
        write_report(runs, tmp_path / "out", ["s", "l"])


def test_run_labels_name_what_differs_between_the_plotted_runs(runs):
    records = collect_runs(runs)
    small = [r for r in records if r.preset == "s"]
    assert run_labels(small) == {
        "s-lr0.0003-wd0": "lr=0.0003, wd=0",
        "s-lr0.001-wd0.1": "lr=0.001, wd=0.1",
        "s-lr0.003-wd0.1": "lr=0.003, wd=0.1",
    }  # runtime.output_dir differs too, but says nothing about the run
    medium = [r for r in records if r.preset == "m"]
    assert run_labels(medium)["m-parent0"] == "lr=0.0003, wd=0, β2=0.99"
    same_lr = [r for r in small if r.weight_decay == 0.1]
    assert list(run_labels(same_lr).values()) == ["lr=0.001", "lr=0.003"]
    # nothing differs, a single run, too many differences or a missing recipe: the run ids
    twin = [small[1], replace(small[1], run="twin")]
    assert run_labels(twin) == {"s-lr0.001-wd0.1": "s-lr0.001-wd0.1", "twin": "twin"}
    assert run_labels(small[:1]) == {"s-lr0.0003-wd0": "s-lr0.0003-wd0"}
    assert run_labels([small[1], medium[1]])["m-parent0"] == "m-parent0"  # layers, lr, wd and β2 differ
    assert run_labels([small[0], replace(small[1], recipe={})])["s-lr0.0003-wd0"] == "s-lr0.0003-wd0"
    assert differing_keys([{"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": None}]) == ["a.c"]


def test_curves_keep_legends_off_the_data_and_identical_runs_apart(runs):
    records = collect_runs(runs)
    twin = replace(records[1], run="s-twin", configuration="s-twin")  # the same curve as s-lr0.001-wd0.1
    twin.recipe = {**twin.recipe, "runtime": {**twin.recipe["runtime"], "seed": 7}}
    fig = draw_curves([*records, twin])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    try:
        assert len(fig.axes) == 4  # per size: training loss | subset validation loss
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:  # beside the validation panel of each size
                assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
            lines = ax.get_lines()
            assert len(
                {(line.get_marker(), line.get_linestyle(), line.get_color()) for line in lines}
            ) == len(lines)
        assert fig.axes[0].get_legend() is None and len(fig.axes[0].get_lines()) == 4  # dense train loss
        assert len(fig.axes[0].get_lines()[0].get_xdata()) == 3  # one point per train row
        texts = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
        assert texts == [
            "lr=0.0003, wd=0, seed=42",
            "lr=0.001, wd=0.1, seed=42",
            "lr=0.001, wd=0.1, seed=7",  # lines in rank order: the twin ties with lr 0.001 and beats lr 0.003
            "lr=0.003, wd=0.1, seed=42",
        ]
        labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
        assert labels and all(re.fullmatch(r"-?[\d.]+[kMB]?", label) for label in labels), labels
    finally:
        plt.close(fig)


class _TableParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        self.tags.append(f"/{tag}")

    def handle_data(self, data):
        if self.rows and self.rows[-1] and self.tags and self.tags[-1] in ("td", "th"):
            self.rows[-1][-1] += data


def test_table_html_is_the_markdown_table_rendered(runs, tmp_path):
    out = tmp_path / "report"
    write_report(runs, out)
    page = (out / "table.html").read_text(encoding="utf-8")
    parser = _TableParser()
    parser.feed(page)
    assert "table" in parser.tags and "pre" not in parser.tags
    header, *body = parser.rows
    assert header == list(TABLE_HEADER)
    runs_rows = [cells for cells in body if len(cells) == len(TABLE_HEADER)]  # stage rows span the table
    assert [cells[0] for cells in body if len(cells) == 1] == ["stage1", "stage2"]
    assert runs_rows == parse_table((out / "report.md").read_text())
    rows = [row for row in json.loads((out / "comparison.json").read_text()) if row["kind"] == "run"]
    assert runs_rows == [table_cells(row) for row in rows]
    assert '<tr class="best"><td>s-lr0.0003-wd0</td>' in page and '<tr class="diverged"><td>m-parent2' in page
    assert "Diverged (non-finite loss; ranked last): m-parent2." in page


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    """Two configurations x two seeds; one seed of the lower-lr configuration diverged."""
    root = tmp_path / "seeded"
    losses = {("s-lr0.001-wd0.1", 1e-3): (4.0, None), ("s-lr0.003-wd0.1", 3e-3): (3.5, 3.7)}
    configurations = {}
    for (configuration, lr), pair in losses.items():
        configurations[configuration] = []
        for seed, loss in zip((42, 43), pair, strict=True):
            run = f"{configuration}-s{seed}"
            configurations[configuration].append(run)
            run_dir = make_run(root, "stage1", run, loss=loss or 9.0, lr=lr)
            recipe = yaml.safe_load((run_dir / "resolved.yaml").read_text())
            recipe["runtime"]["seed"] = seed
            (run_dir / "resolved.yaml").write_text(yaml.safe_dump(recipe))
            if loss is None:
                result = {"status": "diverged", "final_validation": None, "step": 3}
                (run_dir / "result.json").write_text(json.dumps(result))
    stage = {"stage": "stage1", "size": "s", "runs": [r for rs in configurations.values() for r in rs]}
    stage["configurations"] = configurations
    (root / "campaign.json").write_text(json.dumps({"stages": [stage]}))
    return root


def test_seeded_report_aggregates_configurations(seeded, tmp_path):
    out = tmp_path / "report"
    summary = write_report(seeded, out, ["s"])
    assert summary["best"] == {"s": "s-lr0.003-wd0.1"} and summary["configurations"] == 2
    rows = json.loads((out / "comparison.json").read_text())
    runs = [r for r in rows if r["kind"] == "run"]
    assert [(r["run"], r["seed"], r["configuration"]) for r in runs] == [
        ("s-lr0.003-wd0.1-s42", 42, "s-lr0.003-wd0.1"),
        ("s-lr0.003-wd0.1-s43", 43, "s-lr0.003-wd0.1"),
        ("s-lr0.001-wd0.1-s42", 42, "s-lr0.001-wd0.1"),  # the better single run, but a diverged seed
        ("s-lr0.001-wd0.1-s43", 43, "s-lr0.001-wd0.1"),
    ]
    best, worst = [r for r in rows if r["kind"] == "configuration"]
    assert best["loss_mean"] == pytest.approx(3.6) and best["loss_sd"] == pytest.approx(0.141421, abs=1e-6)
    assert best["n"] == 2 and best["runs"] == ["s-lr0.003-wd0.1-s42", "s-lr0.003-wd0.1-s43"]
    assert best["seeds"] == [42, 43] and best["rank"] == 0 and best["diverged"] == []
    assert worst["loss_mean"] is None and worst["loss_sd"] is None and worst["rank"] == 1
    assert worst["diverged"] == ["s-lr0.001-wd0.1-s43"] and worst["losses"] == [4.0, None]
    report_md = (out / "report.md").read_text()
    assert (
        "| s-lr0.003-wd0.1 | adamw | 42, 43 | 200,000 | 0.003 | 0.1 | 0.9 | 0.95 | 3.600000 ± 0.141421 |"
        in report_md
    )
    assert (
        "| s-lr0.001-wd0.1 | adamw | 42, 43 | 200,000 | 0.001 | 0.1 | 0.9 | 0.95 | diverged (1 of 2 seeds) |"
        in report_md
    )
    assert "counted as the worst loss, so its configuration ranks after every configuration" in report_md
    assert "s-lr0.001-wd0.1-s43." in report_md
    assert "- s: `s-lr0.003-wd0.1` (loss 3.600000 ± 0.141421 over 2 seeds)" in report_md
    page = (out / "table.html").read_text()
    assert "3.600000 ± 0.141421" in page and '<tr class="best"><td>s-lr0.003-wd0.1</td>' in page
    selected = (out / "selected-s.yaml").read_text()
    assert selected.startswith(
        "# Best configuration for size s: s-lr0.003-wd0.1 (final validation loss 3.600000"
    )
    assert yaml.safe_load(selected)["runtime"]["seed"] == 42


def test_seeded_curves_are_means_with_a_band(seeded):
    records = collect_runs(seeded)
    fig = draw_curves(records)
    try:
        train_ax, val_ax = fig.axes
        assert len(val_ax.get_lines()) == 2 and len(train_ax.get_lines()) == 2  # one line per configuration
        assert len(val_ax.collections) == 2 and len(train_ax.collections) == 2  # the seeds' range as a band
        best = val_ax.get_lines()[0]  # s-lr0.003: mean of 3.5 and 3.7 (+ 1e4 / tokens) at each epoch
        assert list(best.get_ydata()) == pytest.approx([3.6 + 1e4 / 8192, 3.6 + 1e4 / 16384])
        assert "2 configurations × 2 seeds" in val_ax.get_title()
        assert [t.get_text() for t in val_ax.get_legend().get_texts()] == ["lr=0.003", "lr=0.001"]
    finally:
        plt.close(fig)


def test_a_muon_row_names_its_optimizer_and_muon_lr():
    assert optimizer_cell({"optimizer": "muon", "muon_lr": 0.02}) == "muon (muon_lr 0.02)"
    assert optimizer_cell({"optimizer": "adamw", "muon_lr": None}) == "adamw"


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    """Stage 1 of a campaign: four configurations of three seeds; stage 2 promotes two. The second and third
    are not told apart by their seeds."""
    root = tmp_path / "noisy"
    losses = {
        ("s-lr0.001-wd0.1", 1e-3): (3.00, 3.01, 3.02),
        ("s-lr0.002-wd0.1", 2e-3): (3.05, 3.06, 3.04),
        ("s-lr0.003-wd0.1", 3e-3): (3.051, 3.07, 3.045),
        ("s-lr0.004-wd0.1", 4e-3): (3.50, 3.52, 3.51),
    }
    configurations = {}
    for (configuration, lr), seeds in losses.items():
        configurations[configuration] = [f"{configuration}-s{seed}" for seed in range(3)]
        for run, loss in zip(configurations[configuration], seeds, strict=True):
            make_run(root, "stage1", run, loss=loss, lr=lr)
    stage1 = {"stage": "stage1", "size": "s", "runs": sum(configurations.values(), [])}
    stage2 = {"stage": "stage2", "size": "s", "runs": [], "configurations": {}, "parents": 2}
    (root / "campaign.json").write_text(
        json.dumps({"stages": [{**stage1, "configurations": configurations}, stage2]})
    )
    return root


def test_a_seeded_campaign_report_shows_the_noise_floor_the_verdicts_and_the_cut(noisy, tmp_path):
    from tiny_llm.campaign import significance

    out = tmp_path / "report"
    write_report(noisy, out)
    rows = json.loads((out / "comparison.json").read_text())
    (stage,) = [r for r in rows if r["kind"] == "stage"]
    groups = [[3.00, 3.01, 3.02], [3.05, 3.06, 3.04], [3.051, 3.07, 3.045], [3.50, 3.52, 3.51]]
    sd, dof = significance.pooled_sd(groups)
    assert stage["pooled_sd"] == pytest.approx(sd) and stage["dof"] == dof == 8 and stage["seeds"] == 3
    assert stage["detectable_difference"] == pytest.approx(significance.detectable_difference(sd, 3))
    cut = stage["cut"]
    assert (cut["last_promoted"], cut["first_left_behind"]) == ("s-lr0.002-wd0.1", "s-lr0.003-wd0.1")
    assert cut["inside_noise"] and cut["verdict"] == "within noise"
    configurations = [r for r in rows if r["kind"] == "configuration"]
    assert [c["promoted"] for c in configurations] == [True, True, False, False]
    assert [c["versus_best"] and c["versus_best"]["verdict"] for c in configurations] == [
        None,
        "worse",
        "worse",
        "worse",
    ]
    assert configurations[0]["bpb_mean"] == pytest.approx(3.01 * 0.375)
    report_md = (out / "report.md").read_text()
    assert "## How sure: noise floor, verdicts and the cut" in report_md
    assert "Cut after 2: s-lr0.002-wd0.1 against s-lr0.003-wd0.1" in report_md
    assert "**inside the noise**" in report_md and "| | ✂ cut (inside the noise) |" in report_md
    assert "| 1 | s-lr0.001-wd0.1 | 3 | 3.010000 ± 0.005774 | 1.1287 | best |" in report_md
    page = (out / "table.html").read_text()
    assert '<tr class="cut-noise"><td class="num">2</td><td>s-lr0.002-wd0.1</td>' in page
    png = (out / "intervals.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    # the page shows the plot on its own (the HTML report embeds table.html alone): the image is in it
    assert f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"' in page
    assert 'src="intervals.png"' not in page
