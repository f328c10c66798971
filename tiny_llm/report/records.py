"""The report's view of finished runs: one record per run directory, grouped and ranked by configuration.

A run's ``outcome`` is ``campaign.ranking``'s ``RunOutcome``, and configurations are grouped and ranked by
``campaign.ranking`` itself, so the report orders rows exactly as the campaign promotes: by stage, then by the
rank of their configuration (mean final full-validation loss over its seeds; a diverged seed counts as the
worst loss; ties -> lower lr, weight decay, beta1, beta2), then by seed.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from tiny_llm.campaign.ranking import (
    ConfigurationOutcome,
    RunOutcome,
    configuration_key,
    final_bpb,
    final_loss,
    loss_summary,
)
from tiny_llm.campaign.ranking import (
    group_configurations as group_outcomes,
)
from tiny_llm.campaign.significance import StageNoise, place_fields
from tiny_llm.config import OptimizerLabel
from tiny_llm.errors import REBUILD_CAMPAIGN, REBUILD_RESULT, DataError
from tiny_llm.io import is_replaced_run, read_json_mapping, read_yaml
from tiny_llm.train.metrics import read_metrics

SHAPE_KEYS = ("vocab_size", "num_layers", "width", "num_heads", "ffn_width", "context_length")


@dataclass
class RunRecord:
    """One finished run as the report sees it."""

    run: str
    stage: str | None
    preset: str
    parameters: int | None
    lr: float | None
    weight_decay: float | None
    beta2: float | None
    loss: float | None
    tokens: int | None
    median_tokens_per_second: float | None
    peak_memory_bytes: int | None
    status: str
    """'complete', or 'diverged' for a run that stopped on a non-finite loss (no final loss)."""
    recipe: dict[str, Any] = field(repr=False)
    curve: list[tuple[int, float]] = field(repr=False)
    """(training tokens, subset validation loss) after every epoch."""
    train_curve: list[tuple[int, float]] = field(default_factory=list, repr=False)
    """(training tokens, training loss of the logged window) of every train row."""
    beta1: float | None = None
    seed: int | None = None
    configuration: str = ""
    """The campaign configuration the run is a seed of ('' = a configuration of its own)."""
    bpb: float | None = None
    """Final full-validation bits per byte (None: a run from before it was measured)."""

    @property
    def configuration_id(self) -> str:
        return self.configuration or self.run

    def row(self) -> dict[str, Any]:
        keys = ("run", "stage", "preset", "parameters", "lr", "weight_decay", "beta2", "loss", "tokens")
        out: dict[str, Any] = {"kind": "run", **{k: getattr(self, k) for k in keys}}
        out["median_tokens_per_second"] = self.median_tokens_per_second
        out["peak_memory_bytes"] = self.peak_memory_bytes
        out["beta1"] = self.beta1
        out["seed"] = self.seed
        out["configuration"] = self.configuration_id
        out["status"] = self.status
        out["optimizer"], out["muon_lr"] = self.optimizer.name, self.optimizer.muon_lr
        out["bpb"] = self.bpb
        return out

    @property
    def optimizer(self) -> OptimizerLabel:
        return OptimizerLabel.of(self.recipe.get("optimizer") or {})

    @property
    def outcome(self) -> RunOutcome:
        """What ranking needs; a missing loss or optimizer value ranks last."""
        inf = math.inf
        return RunOutcome(
            self.run,
            self.loss if self.loss is not None else inf,
            self.lr if self.lr is not None else inf,
            self.weight_decay if self.weight_decay is not None else inf,
            self.beta2 if self.beta2 is not None else inf,
            self.beta1 if self.beta1 is not None else inf,
            self.configuration_id,
            self.seed,
            self.optimizer,
            self.bpb,
        )


@dataclass
class ConfigurationRecord:
    """The runs (one per seed) of one configuration of a stage: their ranking outcome and their records."""

    outcome: ConfigurationOutcome
    stage: str | None
    members: list[RunRecord]
    """Its runs, by seed (in the order of ``outcome.runs``)."""
    rank: int = 0
    """Rank within its stage (0 = best)."""
    noise: StageNoise | None = None
    """Its stage's noise floor and comparisons (``report.noise.attach_noise``)."""

    @property
    def configuration(self) -> str:
        return self.outcome.configuration

    @property
    def preset(self) -> str:
        return self.members[0].preset

    @property
    def first(self) -> RunRecord:
        return self.members[0]

    @property
    def mean(self) -> float | None:
        """Mean final loss over the seeds; None when a seed has no final loss."""
        return loss_summary(self.outcome.losses)[0]

    @property
    def sd(self) -> float | None:
        return self.outcome.sd

    @property
    def diverged(self) -> list[str]:
        return self.outcome.diverged

    def row(self) -> dict[str, Any]:
        rates = [m.median_tokens_per_second for m in self.members if m.median_tokens_per_second is not None]
        peaks = [m.peak_memory_bytes for m in self.members if m.peak_memory_bytes is not None]
        first = self.first
        return {
            "kind": "configuration",
            "configuration": self.configuration,
            "stage": self.stage,
            "preset": self.preset,
            "rank": self.rank,
            "parameters": first.parameters,
            "lr": first.lr,
            "weight_decay": first.weight_decay,
            "beta1": first.beta1,
            "beta2": first.beta2,
            "optimizer": first.optimizer.name,
            "muon_lr": first.optimizer.muon_lr,
            "loss_mean": self.mean,
            "loss_sd": self.sd,
            "n": len(self.members),
            "runs": [m.run for m in self.members],
            "seeds": [m.seed for m in self.members],
            "losses": [m.loss for m in self.members],
            "diverged": self.diverged,
            "tokens": first.tokens,
            "median_tokens_per_second": float(statistics.median(rates)) if rates else None,
            "peak_memory_bytes": max(peaks) if peaks else None,
            "bpb_mean": self.outcome.bpb,
            "bpb_sd": self.outcome.bpb_sd,
            **self.noise_fields(),
        }

    def noise_fields(self) -> dict[str, Any]:
        """Its standard error, its difference to the stage's best (Welch 95%) and its side of the cut."""
        return {} if self.noise is None else place_fields(self.noise, self.configuration, self.rank)


def _stage_order(stage: str | None) -> tuple[int, str]:
    match = re.fullmatch(r"stage(\d+)", stage or "")
    return (int(match.group(1)), "") if match else (10**9, stage or "")


# ----------------------------------------------------------------------------- reading


def median_train_rate(rows: list[dict[str, Any]]) -> float | None:
    rates = [
        r["tokens_per_second"]
        for r in rows
        if r.get("event") == "train" and _number(r.get("tokens_per_second"))
    ]
    return float(statistics.median(rates)) if rates else None


def subset_curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(training tokens, subset validation loss) after every epoch."""
    points = {}
    for r in rows:
        subset = r.get("event") == "validation" and r.get("split", "subset") == "subset"
        if subset and _number(r.get("tokens")) and _number(r.get("loss")):
            points[int(r["tokens"])] = float(r["loss"])  # a resumed run may repeat a row: keep the last
    return sorted(points.items())


def train_curve(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(training tokens, training loss of the logged window) of every train row (dense, between epochs)."""
    points = {}
    for r in rows:
        if r.get("event") == "train" and _number(r.get("tokens")) and _number(r.get("loss")):
            points[int(r["tokens"])] = float(r["loss"])
    return sorted(points.items())


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shape_key(recipe: dict[str, Any]) -> tuple | None:
    """Model shape plus the number of packed models (packed presets share their base shape)."""
    model = recipe.get("model") or {}
    if not all(k in model for k in SHAPE_KEYS):
        return None
    packed = (recipe.get("decentralized") or {}).get("num_models", 1)
    return (*(model[k] for k in SHAPE_KEYS), packed)


def _preset_shapes() -> dict[tuple, str]:
    shapes: dict[tuple, str] = {}
    folder = resources.files("tiny_llm") / "presets"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".yaml"):
            key = _shape_key(yaml.safe_load(item.read_text(encoding="utf-8")) or {})
            if key is not None:
                shapes.setdefault(key, item.name[: -len(".yaml")])
    return shapes


def _campaign_sizes(runs_dir: Path) -> dict[str, str]:
    """Run id -> size, from a campaign.json in the runs directory (an extra seed: its configuration's)."""
    record = runs_dir / "campaign.json"
    if not record.is_file():
        return {}
    stages = read_json_mapping(record, REBUILD_CAMPAIGN).get("stages", [])
    sizes = {run: stage["size"] for stage in stages for run in stage["runs"]}
    by_configuration = {c: s["size"] for s in stages for c in s["configurations"]}
    extras = _tie_members(runs_dir)
    return {**sizes, **{run: by_configuration[c] for run, c in extras.items() if c in by_configuration}}


def _campaign_configurations(runs_dir: Path) -> dict[str, str]:
    """Run id -> its configuration, from a campaign.json in the runs directory and the extra seeds of its
    tie-resolving rounds."""
    record = runs_dir / "campaign.json"
    if not record.is_file():
        return {}
    members = {}
    for stage in read_json_mapping(record, REBUILD_CAMPAIGN).get("stages", []):
        for configuration, runs in stage["configurations"].items():
            members.update(dict.fromkeys(runs, configuration))
    return {**members, **_tie_members(runs_dir)}


def _tie_members(runs_dir: Path) -> dict[str, str]:
    """An extra seed's run id -> its configuration, from ``campaign.promotion.resolve_ties``'s round files."""
    members = {}
    for path in sorted(runs_dir.glob("stage*/ties/round-*.json")):
        for entry in read_json_mapping(path, REBUILD_CAMPAIGN).get("runs", []):
            members[entry["run"]] = entry["configuration"]
    return members


def _size_of(run: str, recipe: dict[str, Any], sizes: dict[str, str], shapes: dict[tuple, str]) -> str:
    if run in sizes:
        return sizes[run]
    key = _shape_key(recipe)
    if key is None:
        return "unknown"
    return shapes.get(key, f"{recipe['model']['num_layers']}x{recipe['model']['width']}")


def _load_recipe(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "resolved.yaml"
    if not path.is_file():
        return {}
    rebuild = f"rebuild it with `tiny-llm resolve --config <the recipe the run was trained with> > {path}`"
    data = read_yaml(path, rebuild)
    return data if isinstance(data, dict) else {}


def load_run(
    run_dir: Path,
    runs_dir: Path,
    sizes: dict[str, str],
    shapes: dict[tuple, str],
    configurations: dict[str, str] | None = None,
) -> RunRecord:
    result = read_json_mapping(run_dir / "result.json", REBUILD_RESULT)
    recipe = _load_recipe(run_dir)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    opt = recipe.get("optimizer") or {}
    relative = run_dir.relative_to(runs_dir).parts
    loss = final_loss(result)
    median = median_train_rate(metrics)
    if median is None and _number(result.get("training_tokens_per_second")):
        median = float(result["training_tokens_per_second"])
    peak = result.get("peak_memory_bytes")
    return RunRecord(
        run=run_dir.name,
        stage=relative[0] if len(relative) > 1 else None,
        preset=_size_of(run_dir.name, recipe, sizes, shapes),
        parameters=result.get("parameters"),
        lr=opt.get("lr"),
        weight_decay=opt.get("weight_decay"),
        beta2=opt.get("beta2"),
        loss=loss if math.isfinite(loss) else None,
        tokens=result.get("tokens"),
        median_tokens_per_second=median,
        peak_memory_bytes=int(peak) if _number(peak) and peak > 0 else None,
        status=str(result.get("status", "complete")),
        recipe=recipe,
        curve=subset_curve(metrics),
        train_curve=train_curve(metrics),
        beta1=opt.get("beta1"),
        seed=(recipe.get("runtime") or {}).get("seed"),
        configuration=(configurations or {}).get(run_dir.name, ""),
        bpb=final_bpb(result),
    )


def collect_runs(runs_dir: str | Path) -> list[RunRecord]:
    """Every run under ``runs_dir`` with a result.json, ordered by stage, configuration rank, then seed."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise DataError(f"runs directory not found: {root}")
    found = sorted(p.parent for p in root.rglob("result.json") if not is_replaced_run(p.parent))
    if not found:
        raise DataError(f"no finished runs (result.json) under {root}; train some runs first")
    sizes, shapes, members = _campaign_sizes(root), _preset_shapes(), _campaign_configurations(root)
    records = [load_run(d, root, sizes, shapes, members) for d in found]
    return [m for c in group_configurations(records) for m in c.members]


def _seed_order(rec: RunRecord) -> tuple:
    return (rec.seed is not None, rec.seed if rec.seed is not None else 0, rec.run)


def group_configurations(records: list[RunRecord]) -> list[ConfigurationRecord]:
    """Runs grouped by (stage, configuration) with ``campaign.ranking``, ranked within each stage, stages in
    order; members by seed."""
    by_stage: dict[str | None, list[RunRecord]] = {}
    for rec in sorted(records, key=_seed_order):
        by_stage.setdefault(rec.stage, []).append(rec)
    configurations = []
    for stage, members in by_stage.items():
        by_run = {m.run: m for m in members}
        for outcome in group_outcomes(m.outcome for m in members):
            runs = [by_run[o.run_id] for o in outcome.runs]
            configurations.append(ConfigurationRecord(outcome, stage, runs))
    configurations.sort(key=lambda c: (_stage_order(c.stage), configuration_key(c.outcome)))
    ranks: dict[str | None, int] = {}
    for c in configurations:
        c.rank = ranks.get(c.stage, 0)
        ranks[c.stage] = c.rank + 1
    return configurations


def best_per_size(configurations: list[ConfigurationRecord]) -> dict[str, ConfigurationRecord]:
    """Size -> its best configuration whose seeds all have a final loss, sizes in order of appearance."""
    best: dict[str, ConfigurationRecord] = {}
    for c in configurations:
        if c.mean is None:
            continue
        if c.preset not in best or configuration_key(c.outcome) < configuration_key(best[c.preset].outcome):
            best[c.preset] = c
    return best
