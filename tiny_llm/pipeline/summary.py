"""The HTML report's front page: what the workflow ran and what won, as reStructuredText.

Written by rule summarize_workflow (rules/report.smk) once every stage of the default target is finished,
from the plan (what ran) and the finished result files (what won): the best run of each size with its loss
and bits per byte, the selected candidate of each tuning profile, each campaign stage's best configuration,
the packed benchmark's speedups, the best WSD horizon, the noise study's spread and the scaling fit's
prediction against the run that verified it. report/workflow.rst includes it. A result that is missing or
unreadable leaves its line out. Torch- and Snakemake-free.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiny_llm.io import atomic_write_text
from tiny_llm.pipeline.controller import best_runs
from tiny_llm.pipeline.layout import (
    FIT_SUMMARY,
    HORIZONS_SUMMARY,
    NOISE_SUMMARY,
    PACKED_BENCH_SUMMARY,
    TUNING_SUMMARY,
    fill,
)

if TYPE_CHECKING:
    from tiny_llm.pipeline.plan import WorkflowPlan


def _json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _nats(value: Any, sd: Any = None) -> str:
    loss, spread = _number(value), _number(sd)
    if loss is None:
        return "no final loss"
    return f"{loss:.4f}" + ("" if spread is None else f" ± {spread:.4f}")


def _bpb(value: Any) -> str:
    bpb = _number(value)
    return "" if bpb is None else f", {bpb:.4f} bpb"


def _names(names: list[str]) -> str:
    return ", ".join(f"``{name}``" for name in names)


# ----------------------------------------------------------------------------- what ran


def ran_lines(plan: WorkflowPlan) -> list[str]:
    """One bullet per stage of the default target: what it trained or measured."""
    config = plan.config
    lines = []
    runs = config["runs"]
    if runs:
        sizes = sorted({spec["size"] for spec in runs.values()})
        lines.append(f"Plain runs: {_names(list(runs))} (size {', '.join(sizes)}).")
    for profile in plan.tuning.default_profiles:
        count = len(plan.tuning.slots[profile])
        lines.append(
            f"Throughput tuning, profile ``{profile}`` on {plan.tuning.size(profile)}: {count} candidates."
        )
    if plan.campaign.enabled:
        lines.append(
            "Recipe campaign: " + "; ".join(_stage_text(plan, s) for s in plan.campaign.stage_names) + "."
        )
    if plan.packed.enabled:
        lines.append(
            f"Packed training: {_names(list(config['packed']['runs']))}; the packed-vs-sequential benchmark."
        )
    if plan.export.enabled:
        lines.append(
            "Exports: every plain run and the campaign's best run of each size, with sample continuations."
        )
    if plan.analysis.enabled:
        lines.append(f"Second-order analysis of {_names(list(config['analysis']['runs']))}.")
    if plan.horizons.enabled:
        horizons = config["horizons"]
        lines.append(
            f"WSD horizon study on {', '.join(plan.horizons.sizes)}: horizons "
            f"{', '.join(map(str, horizons['horizons']))} "
            f"tokens per parameter, seeds {', '.join(map(str, horizons['seeds']))}."
        )
    if plan.noise.enabled:
        noise = config["noise"]
        lines.append(f"Noise study on {noise['size']}: {noise['repeats']} seeds per source of randomness.")
    if plan.fit.enabled:
        lines.append(_fit_ran_text(plan))
    return lines


def _fit_ran_text(plan: WorkflowPlan) -> str:
    sizes = ", ".join(name for _, name in sorted(plan.fit.sizes.items()))
    text = f"Scaling fit: L(N, D) over {sizes}, with bootstrap intervals"
    verify = plan.fit.section["verify"]
    if verify is None:
        return text + "."
    return (
        f"{text}; it predicts {verify['size']} at {verify['horizon']} tokens per parameter before that run "
        "trains."
    )


def _stage_text(plan: WorkflowPlan, stage: str) -> str:
    runs = plan.campaign.runs[stage]
    configurations = len({run.configuration for run in runs})
    return (
        f"{stage} on {plan.campaign.stage_size(stage)}, {configurations} configurations in {len(runs)} runs"
    )


# ----------------------------------------------------------------------------- what won


def best_run_lines(plan: WorkflowPlan) -> list[str]:
    """Per size, the finished run of lowest final loss: its loss, bits per byte and directory (bullets: the
    report's front page is a narrow column, where a table's cells wrap)."""
    return [
        f"Best {size}: ``{Path(r.run_dir).name}``, loss {_nats(r.loss)}{_bpb(r.bpb)} (``{r.run_dir}``)."
        for size, r in best_runs(plan).items()
    ]


def won_lines(plan: WorkflowPlan) -> list[str]:
    """One bullet per finished result that names a winner."""
    lines = [_tuning_line(plan, profile) for profile in plan.tuning.default_profiles]
    if plan.campaign.enabled:
        lines += [_campaign_line(plan, stage) for stage in plan.campaign.stage_names]
    if plan.packed.enabled:
        lines.append(_packed_line())
    if plan.horizons.enabled:
        lines.append(_horizons_line())
    if plan.noise.enabled:
        lines.append(_noise_line())
    if plan.fit.enabled and plan.fit.section["verify"] is not None:
        lines.append(_fit_line(plan.fit.section["verify"]))
    return [line for line in lines if line]


def _tuning_line(plan: WorkflowPlan, profile: str) -> str:
    summary = _json(fill(TUNING_SUMMARY, profile=profile))
    selected = (summary or {}).get("selected") if isinstance(summary, dict) else None
    if not isinstance(selected, dict) or _number(selected.get("tokens_per_second")) is None:
        return ""
    settings = selected.get("settings")
    shown = _chosen_settings(settings if isinstance(settings, dict) else {})
    return (
        f"Tuning ``{profile}``: selected ``{selected.get('name')}`` at "
        f"{selected['tokens_per_second']:,.0f} tokens/s" + (f" ({shown})." if shown else ".")
    )


def _chosen_settings(settings: dict[str, Any]) -> str:
    """What a tuning chose: eager or compiled first (a compile mode only where it compiles), then every other
    setting that is set and switched on."""
    compiled = settings.get("runtime.compile")
    shown = [] if compiled is None else ["compiled" if compiled else "eager"]
    for key, value in settings.items():
        if key == "runtime.compile" or (key == "runtime.compile_mode" and not compiled):
            continue
        if value not in (None, False):
            shown.append(f"{key.rpartition('.')[2]} {value}")
    return ", ".join(shown)


def _campaign_line(plan: WorkflowPlan, stage: str) -> str:
    rows = _json(plan.campaign.ranking(stage))
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], dict):
        return ""
    top = min(rows, key=lambda row: row.get("rank", 0))
    seeds = f" over {top['n']} seeds" if isinstance(top.get("n"), int) and top["n"] > 1 else ""
    return (
        f"Campaign {stage} ({plan.campaign.stage_size(stage)}): best ``{top.get('configuration')}``, loss "
        f"{_nats(top.get('loss'), top.get('loss_sd'))}{seeds}{_bpb(top.get('bpb'))}."
    )


def _packed_line() -> str:
    summary = _json(PACKED_BENCH_SUMMARY)
    rows = summary.get("rows") if isinstance(summary, dict) else None
    speedups = [
        f"{row['num_models']} models {row['speedup']:.1f}×"
        for row in rows or []
        if isinstance(row, dict) and _number(row.get("speedup")) is not None and "num_models" in row
    ]
    return f"Packed training, speed over one model after another: {', '.join(speedups)}." if speedups else ""


def _horizons_line() -> str:
    summary = _json(HORIZONS_SUMMARY)
    rows = summary.get("horizons") if isinstance(summary, dict) else None
    rows = [
        row
        for row in rows or []
        if isinstance(row, dict)
        and _number(row.get("mean_loss")) is not None
        and _number(row.get("tokens_per_parameter")) is not None
    ]
    sizes = sorted({row["parameters"] for row in rows if isinstance(row.get("parameters"), int)})
    if len(sizes) > 1:  # several sizes: each one's horizons after its parameter count
        parts = [
            f"{size:,} parameters: "
            + ", ".join(_horizon(row) for row in rows if row.get("parameters") == size)
            for size in sizes
        ]
        return f"WSD horizons, final loss by horizon: {'; '.join(parts)}."
    losses = [_horizon(row) for row in rows]
    return f"WSD horizons, final loss by horizon: {', '.join(losses)}." if losses else ""


def _horizon(row: dict[str, Any]) -> str:
    return f"{row['tokens_per_parameter']:g} tokens/parameter {_nats(row['mean_loss'])}"


NOISE_SOURCES = {"init": "initial weights", "data": "data order", "both": "both"}
"""The noise study's groups (tiny_llm/report/noise_study.py), as the front page names what varies."""


def _noise_line() -> str:
    summary = _json(NOISE_SUMMARY)
    groups = summary.get("groups") if isinstance(summary, dict) else None
    spreads = [
        f"{NOISE_SOURCES.get(str(group.get('source')), group.get('source'))} {sd:.4f}"
        for group in groups or []
        if isinstance(group, dict) and (sd := _number(group.get("sd"))) is not None
    ]
    return (
        f"Noise study, SD of the final loss over seeds when varying: {', '.join(spreads)}." if spreads else ""
    )


def _fit_line(verify: dict[str, Any]) -> str:
    """The fit's prediction for the verifying run, its prediction interval and what the run realised."""
    summary = _json(FIT_SUMMARY)
    checked = summary.get("verification") if isinstance(summary, dict) else None
    if not isinstance(checked, dict) or not isinstance(loss := checked.get("loss"), dict):
        return ""
    predicted, realised = _number(loss.get("predicted")), _number(loss.get("realised"))
    interval = loss.get("prediction_interval")
    if predicted is None or realised is None or not isinstance(interval, list) or len(interval) != 2:
        return ""
    low, high = (_number(bound) for bound in interval)
    if low is None or high is None:
        return ""
    prediction = checked.get("prediction")
    confidence = _number(prediction.get("confidence")) if isinstance(prediction, dict) else None
    level = f"{confidence:.0%} " if confidence is not None else ""
    verdict = "inside" if low <= realised <= high else "outside"
    return (
        f"Scaling fit: {verify['size']} at {verify['horizon']} tokens per parameter was predicted at loss "
        f"{predicted:.4f} ({level}prediction interval {low:.4f} to {high:.4f}) before it trained, and "
        f"realised {realised:.4f}: {verdict} the interval."
    )


# ----------------------------------------------------------------------------- the page


def summary_rst(plan: WorkflowPlan) -> str:
    """The front page's sections: what ran, the best run of each size, and the other winners."""
    parts = ["What was run", "~~~~~~~~~~~~", "", *[f"- {line}" for line in ran_lines(plan)], ""]
    won = best_run_lines(plan) + won_lines(plan)
    if won:
        parts += ["What won", "~~~~~~~~", "", *[f"- {line}" for line in won], ""]
    return "\n".join(parts)


def write_summary(path: str | Path, plan: WorkflowPlan, log: str | Path | None = None) -> None:
    """``path`` (the front page's text), and one line saying so in ``log``."""
    atomic_write_text(path, summary_rst(plan))
    if log is not None:
        atomic_write_text(log, f"wrote {path}\n")
