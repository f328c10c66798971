"""The scaling fit's report page (torch-free; matplotlib for the figures): the laws and their intervals, the
checks, the compute-optimal split, each variant's effective speedup and the prediction against the run it
predicted. Files: summary.json, report.md, fit.html, loss-fit.png (fitted curves over the runs), isoflop.png
(isoFLOP curves and the compute-optimal N*(C), D*(C))."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from tiny_llm.errors import REBUILD_RESULT
from tiny_llm.io import atomic_write_json, atomic_write_text, read_json_mapping
from tiny_llm.output_dirs import check_output_dir, claim_output_dir
from tiny_llm.report.tables import TABLE_CSS
from tiny_llm.scaling.law import DataLaw, JointLaw
from tiny_llm.scaling.predict import laws_of, verification

FIT_FILES = ("summary.json", "report.md", "fit.html", "loss-fit.png", "isoflop.png")
UNITS = {"loss": "final validation loss (nats)", "bpb": "bits per byte"}
Table = tuple[str, list[str], list[list[str]]]
"""(title, header, rows) of one table of the page."""


def num(value: Any, digits: int = 4) -> str:
    """A cell: counts up to billions with thousands separators, anything else to ``digits`` figures."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if 1e5 <= abs(value) < 1e10 and digits == 4 else f"{value:.{digits}g}"


def with_interval(estimate: dict[str, Any] | None, digits: int = 4) -> str:
    """'v [lo, hi]' (an unbounded end as ∞; no interval: the value alone)."""
    if estimate is None or estimate["value"] is None:
        return "∞" if estimate is not None else "-"
    ends = estimate["interval"]
    if ends is None:
        return num(estimate["value"], digits)
    low, high = ("∞" if e is None else num(e, digits) for e in ends)
    return f"{num(estimate['value'], digits)} [{low}, {high}]"


# ----------------------------------------------------------------------------- tables


def law_tables(fit: dict[str, Any], metric: str) -> list[Table]:
    joint = fit["fits"][metric]["joint"]
    name = "loss" if metric == "loss" else "bits per byte"
    params = [[p, with_interval(joint["parameters"][p])] for p in JointLaw.NAMES]
    params += [["G", with_interval(joint["G"])], ["N* ∝ C^a: a", with_interval(joint["n_exponent"])]]
    params += [["D* ∝ C^b: b", with_interval(joint["d_exponent"])]]
    loho = joint["leave_one_horizon_out"]
    bound = ", ".join(joint["at_bound"]) or "none"
    checks = [
        ["at an edge of the search (not identified by the data)", bound],
        ["R² (runs)", num(joint["r2"])],
        ["RMSE (runs)", num(joint["rmse"])],
        [f"noise SD of one run ({joint['noise_sd']['source']})", num(joint["noise_sd"]["value"])],
        ["leave-one-horizon-out RMSE", num(loho["rmse"])],
    ]
    checks += [
        [f"  held out: {row['tokens_per_parameter']:g} tokens/param", _loho_cell(row)]
        for row in loho["horizons"]
    ]
    optimal = [
        [num(r["compute"], 3), with_interval(r["n"], 3), with_interval(r["d"], 3), with_interval(r["value"])]
        for r in joint["compute_optimal"]
    ]
    sizes = [[f"{s['n']:,}", *_size_cells(s)] for s in fit["fits"][metric]["per_size"]]
    return [
        (f"Joint law, {name}: L(N, D) = E + A/N^α + B/D^β", ["parameter", "value [interval]"], params),
        (f"Checks, {name}", ["check", "value"], checks),
        (f"Compute-optimal split, {name}", ["C (FLOPs)", "N*", "D*", "L(N*, D*)"], optimal),
        (f"Each size's L(D) = E + B/D^β, {name}", ["N", "E", "B", "β", "R²", "intervals"], sizes),
    ]


def _loho_cell(row: dict[str, Any]) -> str:
    if row.get("mean_abs_error") is None:
        return row.get("reason", "-")
    return f"mean abs. error {num(row['mean_abs_error'])}, max {num(row['max_abs_error'])}"


def _size_cells(row: dict[str, Any]) -> list[str]:
    if row.get("parameters") is None:
        return [row.get("reason", "-"), "-", "-", "-", "-"]
    p = row["parameters"]
    cells = [with_interval(p["E"]), with_interval(p["B"]), with_interval(p["beta"]), num(row["r2"])]
    return [*cells, row["intervals"]]


def speedup_tables(fit: dict[str, Any]) -> list[Table]:
    tables = []
    for name, variant in fit["variants"].items():
        rows = [
            [
                f"{r['n']:,}",
                f"{r['tokens_per_parameter']:g}",
                num(r["variant_loss"]),
                with_interval(r["compute"], 3),
                "-" if r["wall_clock"] is None else with_interval(r["wall_clock"], 3),
            ]
            for r in variant["speedup"]
        ]
        header = ["N", "tokens/param", "variant's loss (law)", "compute speedup", "wall-clock speedup"]
        tables.append((f"Effective speedup of {name} (C_b(L_v) / C_v at equal N)", header, rows))
    return tables


def verification_table(checked: dict[str, Any]) -> Table:
    rows = []
    for metric in ("loss", "bpb"):
        row, expected = checked.get(metric), checked["prediction"].get(metric)
        if row is None or expected is None:
            continue
        law = with_interval({"value": expected["value"], "interval": expected["interval"]})
        low, high = row["prediction_interval"]
        rows.append(
            [metric, law, f"[{num(low)}, {num(high)}]", num(row["realised"]), f"{row['error']:+.4f}",
             "yes" if row["inside"] else "no"]
        )  # fmt: skip
    p = checked["prediction"]
    title = f"Predicted before training, then realised: N = {p['n']:,}, D = {p['d']:,} ({checked['run']})"
    header = ["metric", "law [interval]", "one run's interval", "realised", "error", "inside"]
    return (title, header, rows)


def markdown(tables: list[Table], notes: list[str]) -> str:
    out = ["# Scaling fit", ""]
    for title, header, rows in tables:
        out += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(cells) + " |" for cells in rows]
        out.append("")
    return "\n".join(out + notes) + "\n"


def html(tables: list[Table], notes: list[str]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Scaling fit</title>',
        f"<style>{TABLE_CSS}</style></head><body>",
        "<h1>Scaling fit</h1>",
    ]
    for title, header, rows in tables:
        head = "".join(f"<th>{escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
        parts += [
            f"<h2>{escape(title)}</h2>",
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>",
        ]
    parts += [f'<p class="note">{escape(note)}</p>' for note in notes]
    return "\n".join([*parts, "</body></html>", ""])


# ----------------------------------------------------------------------------- figures


def _band(replicates: list[JointLaw | None], n: float, d: np.ndarray, confidence: float) -> np.ndarray:
    curves = np.array([w.loss(n, d) for w in replicates if w is not None])
    tail = (1 - confidence) / 2
    return np.quantile(curves, [tail, 1 - tail], axis=0)


def _log_axis(axis: Any) -> None:
    """A log axis labelled at 1, 2 and 5 of each decade with compact numbers (12k, 1.5M), not 2×10^4."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from tiny_llm.plotting import compact_number

    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: compact_number(value)))
    axis.set_minor_formatter(NullFormatter())


def _unidentified(joint: dict[str, Any]) -> str:
    """A title's warning when the fit left parameters at an edge of its search."""
    return f"\nat an edge (not identified): {', '.join(joint['at_bound'])}" if joint["at_bound"] else ""


def _loss_range(values: list[float]) -> tuple[float, float]:
    """The y range of a loss figure: the runs' losses and a margin (a law off the data stays off the plot)."""
    low, high = min(values), max(values)
    margin = 0.25 * (high - low) or 0.1
    return low - margin, high + margin


def plot_curves(fit: dict[str, Any], path: Path, checked: dict[str, Any] | None) -> None:
    """Per metric (and per variant, its loss): each run over D, the joint law and its band at each size's N,
    each size's own L(D) dashed; the verify run with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import save_png

    panels = [("", metric, fit["points"], fit["fits"][metric]) for metric in fit["metrics"]]
    panels += [(f"{name}: ", "loss", v["points"], v["loss"]) for name, v in fit["variants"].items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (label, metric, points, result) in zip(axes[0], panels, strict=True):
        law, replicates = laws_of(result["joint"])
        sizes = sorted({p["n"] for p in points})
        top = max(p["d"] for p in points)
        if checked is not None and not label:
            top = max(top, checked["prediction"]["d"])
        d = np.geomspace(min(p["d"] for p in points) / 1.5, top * 1.5, 80)
        per_size = {s["n"]: s for s in result["per_size"]}
        for i, n in enumerate(sizes):
            color = f"C{i % 10}"
            low, high = _band(replicates, n, d, fit["settings"]["confidence"])
            ax.fill_between(d, low, high, color=color, alpha=0.15, linewidth=0)
            ax.plot(d, law.loss(n, d), color=color, label=f"N = {n:,}")
            own = per_size.get(n, {}).get("parameters")
            if own is not None:
                size_law = DataLaw(*(own[k]["value"] for k in DataLaw.NAMES))
                ax.plot(d, size_law.loss(d), color=color, linestyle="--", linewidth=1)
            runs = [(p["d"], r[metric]) for p in points if p["n"] == n for r in p["runs"]]
            ax.scatter([x for x, _ in runs], [y for _, y in runs], color=color, s=18, zorder=3)
        if checked is not None and not label and checked.get(metric) is not None:
            row = checked[metric]
            low, high = row["prediction_interval"]
            x, y = checked["prediction"]["d"], row["predicted"]
            ax.errorbar([x], [y], yerr=[[y - low], [high - y]], fmt="none", ecolor="black", capsize=4,
                        label="prediction (one run's interval)")  # fmt: skip
            ax.scatter([x], [row["realised"]], marker="*", s=140, color="black", zorder=4,
                       label=f"verify run, N = {checked['prediction']['n']:,}")  # fmt: skip
        ax.set_xscale("log")
        _log_axis(ax.xaxis)
        shown = [r[metric] for p in points for r in p["runs"]]
        if checked is not None and not label and checked.get(metric) is not None:
            shown += [checked[metric]["realised"], *checked[metric]["prediction_interval"]]
        ax.set_ylim(*_loss_range(shown))
        ax.set_xlabel("training tokens D")
        ax.set_ylabel(UNITS[metric])
        ax.set_title(
            f"{label}{UNITS[metric]}: joint law (band: bootstrap), each size's L(D) dashed"
            + _unidentified(result["joint"]),
            fontsize=9,
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    save_png(fig, path)


def plot_isoflop(fit: dict[str, Any], path: Path, checked: dict[str, Any] | None) -> None:
    """Left: the loss law along each budget's isoFLOP line (C = 6·N·D) against N, its minimum marked.
    Right: N*(C) and D*(C) with their bootstrap intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import save_png

    joint = fit["fits"]["loss"]["joint"]
    law, _ = laws_of(joint)
    rows = joint["compute_optimal"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, row in enumerate(rows):
        c, n_star = row["compute"], row["n"]["value"]
        n = np.geomspace(n_star / 30, n_star * 30, 120)
        left.plot(n, law.loss(n, c / (6 * n)), color=f"C{i % 10}", label=f"C = {c:.3g} FLOPs")
        left.scatter([n_star], [row["value"]["value"]], color=f"C{i % 10}", marker="o", zorder=3)
    for p in fit["points"]:
        left.scatter([p["n"]] * len(p["runs"]), [r["loss"] for r in p["runs"]], color="grey", s=8, alpha=0.6)
    if checked is not None and checked.get("loss") is not None:
        left.scatter([checked["prediction"]["n"]], [checked["loss"]["realised"]], marker="*", s=140,
                     color="black", zorder=4, label="verify run (realised)")  # fmt: skip
    left.set_xscale("log")
    _log_axis(left.xaxis)
    losses = [r["loss"] for p in fit["points"] for r in p["runs"]] + [r["value"]["value"] for r in rows]
    left.set_ylim(*_loss_range([v for v in losses if v is not None]))
    left.set_xlabel("non-embedding parameters N")
    left.set_ylabel(UNITS["loss"])
    left.set_title(
        "isoFLOP curves of the law (dots: optimum; grey: the fitted runs)" + _unidentified(joint), fontsize=9
    )
    left.legend(fontsize=7)
    left.grid(True, alpha=0.3)
    c = np.array([r["compute"] for r in rows])
    estimates = {key: np.array([r[key]["value"] for r in rows], dtype=float) for key in ("n", "d")}
    finite = [v for a in estimates.values() for v in a if np.isfinite(v) and v > 0]
    # intervals of an unidentified law span hundreds of decades: show those of the estimates
    low, high = (min(finite) / 30, max(finite) * 30) if finite else (1.0, 10.0)
    for key, label, color in (("n", "N*(C)", "C0"), ("d", "D*(C)", "C1")):
        right.plot(c, estimates[key], color=color, marker="o", label=label)
        ends = [r[key]["interval"] for r in rows]
        if all(e is not None and None not in e for e in ends):
            band = np.clip(np.array(ends, dtype=float), low / 10, high * 10)
            right.fill_between(c, band[:, 0], band[:, 1], color=color, alpha=0.2)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_ylim(low, high)
    right.set_xlabel("compute C (FLOPs)")
    right.set_title("compute-optimal split with its bootstrap interval", fontsize=9)
    right.legend(fontsize=8)
    right.grid(True, alpha=0.3)
    save_png(fig, path)


# ----------------------------------------------------------------------------- the page


def write_fit_report(
    fit_path: str | Path,
    output_dir: str | Path,
    prediction_path: str | Path | None = None,
    verify_run: str | Path | None = None,
) -> dict[str, Any]:
    """summary.json, report.md, fit.html and the two figures in ``output_dir`` (new, empty or ours)."""
    check_output_dir(output_dir, "--output-dir")
    fit = read_json_mapping(fit_path, "delete it and rerun the fit (snakemake fit)")
    checked = None
    if prediction_path is not None and verify_run is not None:
        checked = verification(read_json_mapping(prediction_path, REBUILD_RESULT), verify_run)
    tables = [t for metric in fit["metrics"] for t in law_tables(fit, metric)] + speedup_tables(fit)
    if checked is not None:
        tables.insert(0, verification_table(checked))
    settings = fit["settings"]
    notes = [
        f"Intervals: {settings['confidence']:.0%} percentile bootstrap, {settings['bootstrap']} replicates "
        f"({fit['fits']['loss']['joint']['bootstrap']['scheme']}). Bits per byte: {fit['bpb']}.",
        f"The fit: {fit_path}; N = non-embedding parameters, D = training tokens, C = 6·N·D.",
    ]
    out = claim_output_dir(output_dir, "--output-dir")
    summary = {
        "fit": str(fit_path),
        "metrics": fit["metrics"],
        "laws": {
            m: {k: v["value"] for k, v in fit["fits"][m]["joint"]["parameters"].items()}
            for m in fit["metrics"]
        },
        "verification": checked,
        "speedup": {name: v["speedup"] for name, v in fit["variants"].items()},
    }
    atomic_write_json(out / "summary.json", summary)
    atomic_write_text(out / "report.md", markdown(tables, notes))
    atomic_write_text(out / "fit.html", html(tables, notes))
    plot_curves(fit, out / "loss-fit.png", checked)
    plot_isoflop(fit, out / "isoflop.png", checked)
    return summary
