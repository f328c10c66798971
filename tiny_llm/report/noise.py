"""How sure the report's comparisons are (SPEC §12; ``campaign.significance``): per stage, each
configuration's mean ± SE and bits per byte, its difference to the stage's best with Welch's 95% interval and
verdict, the pooled SD with its degrees of freedom, the smallest difference the stage's seeds detect, and the
promotion cut (the next stage's ``parents``; the last stage's selection of its best); a figure of every
stage's intervals with the cut drawn."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

from tiny_llm.campaign.significance import StageNoise, stage_noise
from tiny_llm.errors import REBUILD_CAMPAIGN
from tiny_llm.io import read_json_mapping
from tiny_llm.report.records import ConfigurationRecord
from tiny_llm.report.tables import fmt

NOISE_HEADER = (
    "Rank", "Configuration", "Seeds", "Final loss (mean ± SE)", "bpb", "vs best (95% CI)", "p", "Verdict",
    "Goes on",
)  # fmt: skip
NOISE_NOTE = (
    "Per stage: each configuration's final loss as mean ± standard error over its seeds, its bits per byte, "
    "and its difference to the stage's best with Welch's 95% interval: worse when the interval lies above 0, "
    "within noise when it holds 0 (untested below two seeds a side). The pooled SD is the seeds' spread "
    "within a configuration; the detectable difference is the smallest true difference its seeds find in 80% "
    "of repeats at the 5% level. The cut is the last configuration that goes on against the first left "
    "behind (the next stage's parents; the last stage selects its best): inside the noise when the two are "
    "not told apart."
)


def promoted_counts(runs_dir: str | Path) -> dict[str, int]:
    """Stage -> how many of its configurations go on, from a campaign.json in ``runs_dir`` (none without)."""
    record = Path(runs_dir) / "campaign.json"
    if not record.is_file():
        return {}
    stages = read_json_mapping(record, REBUILD_CAMPAIGN).get("stages", [])
    counts = {}
    for i, stage in enumerate(stages):
        after = stages[i + 1].get("parents") if i + 1 < len(stages) else 1
        if isinstance(after, int) and "stage" in stage:
            counts[stage["stage"]] = after
    return counts


def attach_noise(
    configurations: list[ConfigurationRecord], promoted: dict[str, int]
) -> dict[str | None, StageNoise]:
    """Each stage's noise floor (configurations ranked as they are, best first), set on its configurations."""
    by_stage: dict[str | None, list[ConfigurationRecord]] = {}
    for c in configurations:
        by_stage.setdefault(c.stage, []).append(c)
    noises = {}
    for stage, members in by_stage.items():
        losses = {c.configuration: c.outcome.losses for c in sorted(members, key=lambda c: c.rank)}
        noises[stage] = stage_noise(losses, promoted.get(stage or ""))
        for c in members:
            c.noise = noises[stage]
    return noises


def stage_rows(configurations: list[ConfigurationRecord], noises: dict[str | None, StageNoise]) -> list[dict]:
    """comparison.json's rows of kind ``stage``: each stage's noise floor and its cut."""
    rows = []
    for stage, noise in noises.items():
        size = next(c.preset for c in configurations if c.stage == stage)
        rows.append(
            {
                "kind": "stage",
                "stage": stage,
                "preset": size,
                "configurations": len(noise.spreads),
                **noise.summary(),
            }
        )
    return rows


def _cells(c: ConfigurationRecord) -> list[str]:
    noise = c.noise
    assert noise is not None
    spread = noise.spreads[c.configuration]
    if c.diverged:
        loss = f"diverged ({len(c.diverged)} of {len(c.members)})"
    elif spread.se is None:
        loss = fmt(spread.mean, "loss")
    else:
        loss = f"{fmt(spread.mean, 'loss')} ± {fmt(spread.se, 'loss')}"
    versus = noise.versus_best.get(c.configuration)
    if versus is None:
        difference, p_value, verdict = "best", "", ""
    else:
        difference = _interval(versus.difference, versus.low, versus.high)
        p_value = "-" if versus.p_value is None else f"{versus.p_value:.2g}"
        verdict = versus.verdict
    goes_on = "" if noise.promoted is None else "yes" if c.rank < noise.promoted else "no"
    bpb = "-" if c.outcome.bpb is None else f"{c.outcome.bpb:.4f}"
    return [
        str(c.rank + 1),
        c.configuration,
        str(len(c.members)),
        loss,
        bpb,
        difference,
        p_value,
        verdict,
        goes_on,
    ]


def _interval(difference: float | None, low: float | None, high: float | None) -> str:
    if difference is None:
        return "-"
    if low is None or high is None:
        return f"{difference:+.4f}"
    return f"{difference:+.4f} [{low:+.4f}, {high:+.4f}]"


def describe_stage(stage: str | None, noise: StageNoise) -> str:
    """One paragraph: the pooled SD, the detectable difference and the cut."""
    name = stage or "runs"
    if noise.pooled_sd is None:
        floor = f"{name}: no configuration has two seeds, so there is no noise floor to test against."
    else:
        detect, dof = fmt(noise.detectable, "loss"), f"{noise.dof} degree{'s' * (noise.dof != 1)} of freedom"
        floor = (
            f"{name}: pooled SD {fmt(noise.pooled_sd, 'loss')} ({dof}); at {noise.seeds} seeds a "
            f"configuration the smallest detectable difference is {detect}."
        )
    cut = noise.cut
    if cut is None:
        return floor
    c = cut.comparison
    p_value = "" if c.p_value is None else f", p = {c.p_value:.2g}"
    verdict = "inside the noise" if cut.inside_noise else "the two are told apart"
    return (
        f"{floor} Cut after {cut.promoted}: {cut.last} against {cut.first_left}: "
        f"{_interval(c.difference, c.low, c.high)}{p_value}: **{verdict}**."
    )


def noise_markdown(
    configurations: list[ConfigurationRecord], noises: dict[str | None, StageNoise]
) -> list[str]:
    lines = ["## How sure: noise floor, verdicts and the cut", "", NOISE_NOTE, ""]
    for stage, noise in noises.items():
        members = sorted((c for c in configurations if c.stage == stage), key=lambda c: c.rank)
        lines += [f"### {stage or 'runs'}", "", describe_stage(stage, noise), ""]
        lines += ["| " + " | ".join(NOISE_HEADER) + " |", "|" + "---|" * len(NOISE_HEADER)]
        for c in members:
            lines.append("| " + " | ".join(_cells(c)) + " |")
            if noise.cut is not None and c.configuration == noise.cut.last:
                marker = "inside the noise" if noise.cut.inside_noise else "holds"
                lines.append(f"| | ✂ cut ({marker}) |" + " |" * (len(NOISE_HEADER) - 2))
        lines.append("")
    lines += ["![intervals](intervals.png)", ""]
    return lines


def noise_html(
    configurations: list[ConfigurationRecord], noises: dict[str | None, StageNoise], intervals: Path
) -> list[str]:
    """The section as HTML; the ``intervals`` plot embedded (a data URI), as the page is shown on its own:
    the HTML report embeds table.html alone, where a link to a file beside it finds nothing."""
    from tiny_llm.report.tables import html_table

    parts = [
        "<h2>How sure: noise floor, verdicts and the cut</h2>",
        f'<p class="note">{escape(NOISE_NOTE)}</p>',
    ]
    for stage, noise in noises.items():
        members = sorted((c for c in configurations if c.stage == stage), key=lambda c: c.rank)
        items = []
        for c in members:
            kind = ""
            if noise.cut is not None and c.configuration == noise.cut.last:
                kind = "cut-noise" if noise.cut.inside_noise else "cut-holds"
            items.append((stage, kind, _cells(c)))
        text = escape(describe_stage(stage, noise)).replace("**", "")
        parts += [f"<h3>{escape(stage or 'runs')}</h3>", f"<p>{text}</p>"]
        parts += html_table(NOISE_HEADER, items, stages=False)
    image = base64.b64encode(intervals.read_bytes()).decode("ascii")
    alt = "each stage's configurations with their 95% intervals"
    parts.append(f'<p><img src="data:image/png;base64,{image}" alt="{escape(alt)}"></p>')
    return parts


def plot_intervals(
    configurations: list[ConfigurationRecord], noises: dict[str | None, StageNoise], path: str | Path
) -> None:
    """One panel per stage: every seed's final loss, each configuration's mean with its 95% t interval, best
    at the top, the stage's best mean as a dotted line and the cut as a line between the two sides (red when
    inside the noise)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tiny_llm.plotting import save_png

    stages = list(noises)
    heights = [max(2.0, 0.45 * len(noises[s].spreads) + 1.0) for s in stages]
    fig, axes = plt.subplots(
        len(stages), 1, figsize=(8.5, sum(heights)), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for ax, stage in zip(axes[:, 0], stages, strict=True):
        _panel(
            ax,
            stage,
            noises[stage],
            sorted((c for c in configurations if c.stage == stage), key=lambda c: c.rank),
        )
    axes[-1, 0].set_xlabel("final validation loss (nats per token)")
    fig.tight_layout()
    save_png(fig, path)


def _panel(ax: Any, stage: str | None, noise: StageNoise, members: list[ConfigurationRecord]) -> None:
    for y, c in enumerate(members):
        finite = [x for x in c.outcome.losses if x != float("inf")]
        ax.scatter(finite, [y] * len(finite), s=14, color="0.55", zorder=2)
        spread = noise.spreads[c.configuration]
        interval = spread.interval()
        if spread.mean is None:
            continue
        low, high = interval if interval is not None else (spread.mean, spread.mean)
        ax.errorbar(
            spread.mean,
            y,
            xerr=[[spread.mean - low], [high - spread.mean]],
            fmt="o",
            color="C0",
            capsize=4,
            zorder=3,
        )
    best = noise.spreads[members[0].configuration].mean if members else None
    if best is not None:
        ax.axvline(best, color="C0", linestyle=":", linewidth=1)
    if noise.cut is not None:
        color = "C3" if noise.cut.inside_noise else "C2"
        verdict = "inside the noise" if noise.cut.inside_noise else "holds"
        p_value = noise.cut.comparison.p_value
        label = f"cut: {verdict}" + ("" if p_value is None else f" (p = {p_value:.2g})")
        ax.axhline(noise.cut.promoted - 0.5, color=color, linestyle="--", linewidth=1.5, label=label)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    ax.set_yticks(
        range(len(members)), [f"{c.configuration} (n={len(c.members)})" for c in members], fontsize=8
    )
    ax.invert_yaxis()
    detect = "" if noise.detectable is None else f", detectable difference {noise.detectable:.3g}"
    sd = "" if noise.pooled_sd is None else f"; pooled SD {noise.pooled_sd:.3g} ({noise.dof} dof){detect}"
    ax.set_title(f"{stage or 'runs'}: mean and 95% interval of each configuration{sd}", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
