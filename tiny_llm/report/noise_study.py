"""The noise study's report (torch-free; matplotlib for the plot): each group's final losses (init, data,
both: what varies between its seeds), its variance with a chi-square 95% interval, and its share of the
variance when both sources vary, a ratio of independent variances with an F interval
(``campaign.significance.noise_sources``; SPEC §12)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tiny_llm.campaign.ranking import final_bpb, final_loss
from tiny_llm.campaign.significance import Source, noise_sources
from tiny_llm.errors import DataError
from tiny_llm.io import atomic_write_json, atomic_write_text, read_json_mapping, read_yaml
from tiny_llm.output_dirs import claim_output_dir

GROUP = re.compile(r"-(init|data|both)-s[0-9]+$")
"""A study run's directory name ends with its group and varying seed: ``demo-s-data-s5``."""
LABELS = {"init": "initial weights only", "data": "data order only", "both": "both (as between seeds)"}


def study_runs(run_dirs: list[str | Path]) -> dict[str, list[dict[str, Any]]]:
    """Group -> its runs ({run, seed, data_seed, loss, bpb}), groups in the order init, data, both."""
    groups: dict[str, list[dict[str, Any]]] = {source: [] for source in LABELS}
    for run_dir in map(Path, run_dirs):
        match = GROUP.search(run_dir.name)
        if match is None:
            raise DataError(f"{run_dir}: not a noise-study run (<size>-<init|data|both>-s<seed>)")
        result = read_json_mapping(run_dir / "result.json")
        recipe = read_yaml(run_dir / "resolved.yaml") or {}
        groups[match[1]].append(
            {
                "run": run_dir.name,
                "seed": (recipe.get("runtime") or {}).get("seed"),
                "data_seed": (recipe.get("training") or {}).get("data_seed"),
                "loss": final_loss(result),
                "bpb": final_bpb(result),
            }
        )
    return {source: runs for source, runs in groups.items() if runs}


def write_noise_report(run_dirs: list[str | Path], output_dir: str | Path) -> dict[str, Any]:
    """noise.json, report.md and noise.png in ``output_dir`` (new, empty or one of ours)."""
    groups = study_runs(run_dirs)
    if "both" not in groups:
        raise DataError("noise report: no run of the group 'both', against which the shares are taken")
    out = claim_output_dir(output_dir, "--output-dir")
    sources = noise_sources({g: [r["loss"] for r in runs] for g, runs in groups.items()}, "both")
    shares = [s.share for s in sources if s.name != "both"]
    total = None if None in shares else sum(x for x in shares if x is not None)
    summary = {
        "groups": [{**s.as_dict(), "runs": groups[s.name]} for s in sources],
        "total": "both",
        "sum_of_shares": total,
    }
    atomic_write_json(out / "noise.json", summary)
    atomic_write_text(out / "report.md", _markdown(sources, groups, total))
    _plot(sources, groups, out / "noise.png")
    return summary


def _cell(value: float | None, low: float | None = None, high: float | None = None, digits: int = 6) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}g}"
    return text if low is None or high is None else f"{text} [{low:.{digits}g}, {high:.{digits}g}]"


def _markdown(sources: list[Source], groups: dict[str, list[dict[str, Any]]], total: float | None) -> str:
    lines = [
        "# Noise study: where the seeds' spread comes from",
        "",
        "One configuration, three groups of seeds. Variance: the sample variance of the group's final losses "
        "(nats per token, squared) with its chi-square 95% interval; share: that variance over the variance "
        "when both sources vary, with the F interval of a ratio of independent variances.",
        "",
        "| Varies | Runs | Final loss mean ± SD | Variance [95%] | Share of both [95%] | bpb mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in sources:
        bpb = [r["bpb"] for r in groups[s.name]]
        mean_bpb = sum(bpb) / len(bpb) if all(b is not None for b in bpb) else None
        spread = f"{s.spread.mean:.6f} ± {s.spread.sd:.6f}" if s.spread.sd is not None else "-"
        lines.append(
            f"| {LABELS[s.name]} | {s.spread.n} | {spread} | {_cell(s.variance, s.low, s.high, 3)} | "
            f"{_cell(s.share, s.share_low, s.share_high, 3)} | {_cell(mean_bpb, digits=5)} |"
        )
    if total is not None:
        lines += [
            "",
            f"Init and data shares add up to {total:.2f} (1 when the two sources add independently).",
        ]
    return "\n".join(lines) + "\n"


def _plot(sources: list[Source], groups: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import save_png

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = [s.name for s in sources]
    for x, name in enumerate(names):
        losses = [r["loss"] for r in groups[name]]
        left.scatter([x] * len(losses), losses, color=f"C{x}", s=24, zorder=3)
    left.set_xticks(range(len(names)), [LABELS[n] for n in names], fontsize=8)
    left.set_ylabel("final validation loss (nats per token)")
    left.set_title("each run's final loss", fontsize=9)
    left.grid(axis="y", alpha=0.3)
    for x, s in enumerate(sources):
        if s.variance is None or s.low is None or s.high is None:
            continue
        right.errorbar(
            x,
            s.variance,
            yerr=[[s.variance - s.low], [s.high - s.variance]],
            fmt="o",
            color=f"C{x}",
            capsize=5,
        )
    right.set_yscale("log")
    right.set_xticks(range(len(names)), [LABELS[n] for n in names], fontsize=8)
    right.set_ylabel("variance of the final loss")
    right.set_title("variance with its 95% interval", fontsize=9)
    right.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
