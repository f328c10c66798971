"""Comparison report of finished training runs (torch-free; matplotlib for the plot).

``write_report(runs_dir, out_dir)`` finds every run directory with a
``result.json`` under ``runs_dir`` and writes:

- ``comparison.json``: one row per run {kind "run", run, stage, preset, parameters, lr,
  weight_decay, beta2, loss, tokens, median_tokens_per_second, peak_memory_bytes, beta1, seed,
  configuration, status, optimizer, muon_lr, bpb}; for a campaign (a ``campaign.json`` in ``runs_dir``) also
  one row per configuration {kind "configuration", loss_mean, loss_sd (sample SD, null for one seed), n,
  runs, seeds, diverged, ..., bpb_mean, bpb_sd, loss_se, versus_best, promoted, cut} and one per stage
  {kind "stage", pooled_sd, dof, seeds, detectable_difference, cut};
- ``report.md``: the runs as a Markdown table, and where configurations have several seeds a table of
  configurations with their final loss as mean ± SD;
- ``table.html``: those tables as a standalone HTML page (the Snakemake HTML report shows it rendered);
- ``intervals.png`` (a campaign, or configurations with several seeds): per stage, each configuration's mean
  with its 95% interval, the seeds and the promotion cut (``noise``); report.md and table.html then add a
  section per stage: mean ± SE, bits per byte, the difference to the best with Welch's interval and verdict,
  the pooled SD, the smallest detectable difference and whether the cut is inside the noise;
- ``learning-curves.png``: per size, the training loss of the logged windows and the subset validation
  loss vs training tokens; a configuration with several seeds is drawn as their mean with the seeds'
  range as a band;
- ``selected-<size>.yaml``: the complete recipe of each size's best configuration (its first seed's run).

Modules: ``records`` (run directories -> records, grouped and ranked by ``campaign.ranking``), ``tables``
(Markdown, HTML and the shared CSS), ``curves`` (the learning-curve figure), ``noise`` (the noise floor,
verdicts and cut of every stage: ``campaign.significance``), ``horizons`` (the WSD horizon study's report:
final loss against horizon).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import DataError
from tiny_llm.io import atomic_write_json, atomic_write_text
from tiny_llm.output_dirs import check_output_dir, claim_output_dir
from tiny_llm.report.curves import plot_curves
from tiny_llm.report.noise import (
    attach_noise,
    noise_html,
    noise_markdown,
    plot_intervals,
    promoted_counts,
    stage_rows,
)
from tiny_llm.report.records import ConfigurationRecord, best_per_size, collect_runs, group_configurations
from tiny_llm.report.tables import fmt, markdown, table_html


def selected_yaml(c: ConfigurationRecord, size: str) -> str:
    """The best configuration's complete recipe (its first seed's run), aimed at a fresh run directory
    (training it again must not collide)."""
    rec = c.first
    source = rec.recipe.get("runtime", {}).get("output_dir", rec.run)
    if len(c.members) == 1:
        header = f"# Best run for size {size}: {rec.run} (final validation loss {fmt(rec.loss, 'loss')})\n"
    else:
        spread = f" ± {fmt(c.sd, 'loss')}" if c.sd is not None else ""
        header = (
            f"# Best configuration for size {size}: {c.configuration} (final validation loss "
            f"{fmt(c.mean, 'loss')}{spread} over {len(c.members)} seeds)\n"
            f"# the recipe of its run {rec.run} (seed {rec.seed})\n"
        )
    header += f"# trained in {source}\n"
    recipe = {**rec.recipe}
    if isinstance(recipe.get("runtime"), dict):
        recipe["runtime"] = {**recipe["runtime"], "output_dir": f"runs/selected-{size}"}
    return header + yaml.safe_dump(recipe, sort_keys=False)


def write_report(runs_dir: str | Path, out_dir: str | Path, sizes: list[str] | None = None) -> dict[str, Any]:
    """Write all report files; ``sizes`` (if given) must each get a selected-<size>.yaml. ``out_dir`` is new,
    empty or one of ours (check_output_dir): a directory of a user's files is refused before any work."""
    check_output_dir(out_dir, "--output-dir")
    records = collect_runs(runs_dir)
    configurations = group_configurations(records)
    best = best_per_size(configurations)
    missing = [s for s in sizes or [] if s not in best]
    if missing:
        raise DataError(
            f"no finished run with a final loss for size(s) {', '.join(missing)} under {runs_dir}"
        )
    out = claim_output_dir(out_dir, "--output-dir")
    noises = attach_noise(configurations, promoted_counts(runs_dir))
    rows = [r.row() for r in records]
    campaign = (Path(runs_dir) / "campaign.json").is_file()
    if campaign:  # one aggregate row per configuration, one per stage
        rows += [c.row() for c in configurations] + stage_rows(configurations, noises)
    atomic_write_json(out / "comparison.json", rows)
    plot_curves(records, out / "learning-curves.png")
    compared = campaign or any(len(c.members) > 1 for c in configurations)
    if compared:  # seeds to compare, or a campaign's cuts (untested with one seed): intervals.png, a section
        plot_intervals(configurations, noises, out / "intervals.png")
    for size, c in best.items():
        atomic_write_text(out / f"selected-{size}.yaml", selected_yaml(c, size))
    md = noise_markdown(configurations, noises) if compared else None
    html = noise_html(configurations, noises, out / "intervals.png") if compared else None
    atomic_write_text(out / "report.md", markdown(records, configurations, best, md))
    atomic_write_text(out / "table.html", table_html(records, configurations, best, html))
    return {
        "runs": len(records),
        "configurations": len(configurations),
        "best": {size: c.configuration for size, c in best.items()},
        "output_dir": str(out),
    }
