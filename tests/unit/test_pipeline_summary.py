"""The HTML report's front page (tiny_llm/pipeline/summary.py, report/workflow.rst): what ran and what won."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pipeline_helpers import REPO, plan_of, shipped

from tiny_llm.pipeline.summary import summary_rst, write_summary


def write_json(path: str, content: object) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(content), encoding="utf-8")


def finished_demo() -> None:
    """The result files of a finished demo, small: the values the front page must show."""
    for run, loss, bpb in [("demo-s", 4.5, 1.9), ("demo-s-wsd", 4.25, 1.8), ("demo-s-long", None, None)]:
        final = None if loss is None else {"loss": loss, "bpb": bpb}
        write_json(f"results/runs/{run}/result.json", {"final_validation": final})
    write_json(
        "results/cpu-tuning/summary.json",
        {
            "selected": {
                "name": "s1-m16-eager",
                "tokens_per_second": 15234.6,
                "settings": {
                    "training.micro_batch_size": 16,
                    "runtime.compile": False,
                    "runtime.compile_mode": "default",
                    "runtime.cpu_amp": False,
                },
            }
        },
    )
    stage1 = {"rank": 0, "configuration": "demo-s-lr0.01-wd0.1", "run": "r-s42", "loss": 5.0, "loss_sd": 0.1}
    write_json("results/campaign/stage1/ranking.json", [{**stage1, "n": 2, "bpb": 2.05}])
    stage3 = {
        "configuration": "demo-l-parent0",
        "run": "demo-l-p0-s43",
        "n": 2,
        "loss": 3.75,
        "loss_sd": 0.05,
    }
    runs = {"runs": ["demo-l-p0-s42", "demo-l-p0-s43"], "run_losses": [3.8, 3.7], "run_bpb": [1.61, 1.59]}
    write_json(
        "results/campaign/stage3/ranking.json",
        [{"rank": 1, "configuration": "x"}, {"rank": 0, **stage3, **runs}],
    )
    write_json("results/packed-benchmarks/summary.json", {"rows": [{"num_models": 4, "speedup": 4.83}]})
    horizons = [
        {"tokens_per_parameter": 0.05, "mean_loss": 6.1},
        {"tokens_per_parameter": 0.2, "mean_loss": 5.2},
    ]
    write_json("results/report/horizons/horizons.json", {"horizons": horizons})
    groups = [{"source": "init", "sd": 0.01, "share": 0.6}, {"source": "both", "sd": 0.0125, "share": 1.0}]
    write_json("results/report/noise/noise.json", {"groups": groups, "total": "both"})
    write_json("results/report/fit/summary.json", fit_summary(realised=6.8078))


def test_a_compiled_selection_names_its_compile_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = {"runtime.compile": True, "runtime.compile_mode": "max-autotune", "runtime.cpu_amp": True}
    selected = {"name": "s3-r0-bf16", "tokens_per_second": 59415.2, "settings": settings}
    write_json("results/cpu-tuning/summary.json", {"selected": selected})
    text = summary_rst(plan_of(shipped("workflow_config.yaml")))
    expected = (
        "selected ``s3-r0-bf16`` at 59,415 tokens/s (compiled, compile_mode max-autotune, cpu_amp True)."
    )
    assert expected in text


def fit_summary(realised: float) -> dict:
    """The fit report's summary.json, its verification part: the prediction made before the run trained."""
    interval = [6.2523, 7.045]
    loss = {"predicted": 6.641, "prediction_interval": interval, "realised": realised}
    return {"verification": {"prediction": {"confidence": 0.95}, "loss": loss}}


def test_the_front_page_says_what_ran_and_what_won(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    finished_demo()
    text = summary_rst(plan_of(shipped("workflow_config.yaml")))
    assert "- Plain runs: ``demo-s``, ``demo-s-wsd``, ``demo-s-long``, ``demo-s-muon`` (size demo-s)." in text
    assert "stage1 on demo-s, 6 configurations in 12 runs; stage2 on demo-m" in text
    assert "- Best demo-s: ``demo-s-wsd``, loss 4.2500, 1.8000 bpb (``results/runs/demo-s-wsd``)." in text
    best_l = "- Best demo-l: ``demo-l-p0-s43``, loss 3.7000, 1.5900 bpb (``results/campaign/stage3/demo-l-p0"
    assert best_l in text
    assert (
        "- Tuning ``cpu``: selected ``s1-m16-eager`` at 15,235 tokens/s (eager, micro_batch_size 16)." in text
    )
    assert (
        "- Campaign stage1 (demo-s): best ``demo-s-lr0.01-wd0.1``, loss 5.0000 ± 0.1000 over 2 seeds, "
        in text
    )
    assert "2.0500 bpb." in text
    assert "- Campaign stage3 (demo-l): best ``demo-l-parent0``" in text and "stage2 (demo-m)" not in text
    assert "- Packed training, speed over one model after another: 4 models 4.8×." in text
    assert (
        "WSD horizons, final loss by horizon: 0.05 tokens/parameter 6.1000, 0.2 tokens/parameter 5.2000."
        in text
    )
    assert (
        "- Noise study, SD of the final loss over seeds when varying: initial weights 0.0100, both 0.0125."
        in text
    )
    assert (
        "- Scaling fit: L(N, D) over demo-s, demo-m, demo-l, with bootstrap intervals; it predicts demo-s at "
        "0.4 tokens per parameter before that run trains." in text
    )
    assert (
        "- Scaling fit: demo-s at 0.4 tokens per parameter was predicted at loss 6.6410 (95% prediction "
        "interval 6.2523 to 7.0450) before it trained, and realised 6.8078: inside the interval." in text
    )


def test_a_verified_run_outside_the_fits_interval_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_json("results/report/fit/summary.json", fit_summary(realised=7.2))
    text = summary_rst(plan_of(shipped("workflow_config.yaml")))
    assert "and realised 7.2000: outside the interval." in text


def test_a_horizon_study_over_several_sizes_is_named_by_its_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's study runs over horizons.sizes: the page names them (not horizons.size, None there), and
    each size's losses follow its parameter count, smallest first."""
    monkeypatch.chdir(tmp_path)
    rows = [
        {"parameters": n, "tokens_per_parameter": h, "mean_loss": loss}
        for n, h, loss in [(10000, 0.05, 6.8), (10000, 0.1, 6.5), (2000, 0.05, 7.0), (2000, 0.1, 6.9)]
    ]
    write_json("results/report/horizons/horizons.json", {"horizons": rows})
    text = summary_rst(plan_of(shipped("workflow_config.yaml")))
    study = "- WSD horizon study on demo-s, demo-m, demo-l: horizons 0.05, 0.1, 0.2 tokens per parameter"
    assert study in text
    assert (
        "WSD horizons, final loss by horizon: 2,000 parameters: 0.05 tokens/parameter 7.0000, "
        "0.1 tokens/parameter 6.9000; 10,000 parameters: 0.05 tokens/parameter 6.8000, 0.1 tokens/parameter "
        "6.5000." in text
    )


def test_without_results_the_page_says_what_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_json("results/cpu-tuning/summary.json", {"selected": None})
    Path("results/campaign/stage1").mkdir(parents=True)
    Path("results/campaign/stage1/ranking.json").write_text("{damaged")
    text = summary_rst(plan_of(shipped("workflow_config.yaml")))
    assert "What was run" in text and "What won" not in text


def test_workflow_rst_includes_the_page_as_the_report_renders_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snakemake renders report/workflow.rst with Jinja (the report's files as ``files``), then docutils."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    monkeypatch.chdir(tmp_path)
    finished_demo()
    plan = plan_of(shipped("workflow_config.yaml"))
    write_summary("results/report/summary.rst", plan, log="summary.log")
    template = Environment(trim_blocks=True, lstrip_blocks=True).from_string(
        (REPO / "report" / "workflow.rst").read_text(encoding="utf-8")
    )
    config = SimpleNamespace(config=plan.config)
    summary = SimpleNamespace(target="summary.rst", path=Path("results/report/summary.rst"))

    def front_page(files: list[SimpleNamespace]) -> str:
        rst = template.render(snakemake=config, files=files, categories={})
        return publish_parts(rst, writer_name="html", settings_overrides={"halt_level": 2})["html_body"]

    page = front_page([summary])
    assert (
        "What won" in page
        and "<li>Best demo-s:" in page
        and "demo-s-wsd" in page
        and "15,235 tokens/s" in page
    )
    assert "What won" not in front_page([])  # a report of one stage: no summary in its DAG
