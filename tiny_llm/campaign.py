"""The staged recipe campaign as pure, torch-free functions.

Stage 1 trains a grid of optimizer settings on the smallest size; every later
stage trains the best ``parents`` runs of the stage before on the next size,
each child copying its parent's whole optimizer block (optionally crossed with
a list of beta2 values). Because children are named by their parent's *rank*
(``50m-parent0-beta2-0.99``), every run id is known before anything trains, so
the workflow's DAG is static; a selection step only fills in the recipes.

A campaign directory holds one campaign: its identity (the settings, the
per-size template recipes and the token cache identity) is recorded once in
``identity.json``, and any later plan with a different identity is rejected
instead of mixing results.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.budget import make_budget
from tiny_llm.config import (
    deep_merge,
    identity_differences,
    read_config_source,
    recipe_from_dict,
    recipe_identity_payload,
    recipe_to_dict,
)
from tiny_llm.errors import ConfigError, RunStateError
from tiny_llm.io import canonical_json, read_json

CAMPAIGN_FORMAT = 1
IDENTITY_FILE = "identity.json"
CHANGED_MESSAGE = "campaign settings changed; use a new output directory"
# Execution settings a tuning result may set for a size (never numerics such as amp or the batch).
TUNED_FIELDS = (
    ("training", "micro_batch_size"),
    ("runtime", "compile"),
    ("runtime", "compile_mode"),
    ("runtime", "sdpa_backend"),
    ("runtime", "cpu_threads"),
)


class CampaignChangedError(RunStateError):
    """A campaign directory already holds a campaign with other settings."""


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True, kw_only=True)
class StageConfig:
    """One promotion stage."""

    size: str
    """Size name (a key of the workflow's ``sizes``)."""
    lr: tuple[float, ...] = ()
    """Stage 1 only: peak learning rates of the grid."""
    weight_decay: tuple[float, ...] = ()
    """Stage 1 only: weight decays of the grid."""
    beta2: tuple[float, ...] = ()
    """Stage 1: beta2 values of the grid; later stages: beta2 values per parent (empty = copy it)."""
    parents: int = 0
    """Later stages: how many of the previous stage's best runs are promoted."""


@dataclass(frozen=True, kw_only=True)
class CampaignConfig:
    """Everything that decides which runs a campaign trains and how."""

    root: str
    """Campaign directory (``results/campaign``)."""
    stages: tuple[StageConfig, ...]
    sizes: Mapping[str, Mapping[str, Any]]
    """Size name -> {preset, overrides} (the workflow's ``sizes`` entries)."""
    overrides: Mapping[str, Any]
    """Recipe overrides applied to every campaign run."""
    batch_tokens: Mapping[str, int]
    """Size name -> optimizer batch tokens of its campaign runs."""
    tuning: Mapping[str, str]
    """Size name -> tuning ``selected.yaml`` whose execution settings the size's runs use."""
    throughput: Mapping[str, float]
    """Size name -> tokens/s assumed for the GPU-hour estimate when no tuning result gives it."""
    numerics_version: int = 0
    """The workflow's NUMERICS_VERSION: a bump means results would differ, so it is part of the identity."""


def tuning_selected_path(profile: str) -> str:
    """Where the workflow's tuner writes a profile's selected recipe."""
    return f"results/{profile}-tuning/selected.yaml"


def settings_from_workflow_config(data: Mapping[str, Any]) -> CampaignConfig:
    """A campaign read straight from a workflow config file (for estimates outside Snakemake)."""
    section = dict(data.get("campaign") or {})
    if not section.get("stages"):
        raise ConfigError("campaign.stages: the workflow config defines no campaign")
    defaults = data.get("recipe_defaults") or {}
    sizes = {}
    for name, spec in (data.get("sizes") or {}).items():
        overrides = deep_merge(defaults, spec.get("overrides") or {})
        sizes[name] = {"preset": spec.get("preset"), "overrides": overrides}
    section["tuning"] = {size: tuning_selected_path(p) for size, p in (section.get("tuning") or {}).items()}
    return parse_campaign(section, sizes, section.get("output_dir", "results/campaign"))


def stage_name(index: int) -> str:
    """0-based stage index -> directory name (``stage1``...)."""
    return f"stage{index + 1}"


def _numbers(value: Any, key: str, *, positive: bool) -> tuple[float, ...]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{key}: expected a non-empty list of numbers, got {value!r}")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise ConfigError(f"{key}: expected finite numbers, got {item!r}")
        if item < 0 or (positive and item == 0):
            sign = "positive" if positive else "non-negative"
            raise ConfigError(f"{key}: expected {sign} numbers, got {item}")
        out.append(float(item))
    if len(set(out)) != len(out):
        raise ConfigError(f"{key}: values repeat ({value!r})")
    return tuple(out)


def _stage(raw: Any, index: int) -> StageConfig:
    key = f"campaign.stages[{index}]"
    if not isinstance(raw, dict) or not isinstance(raw.get("size"), str):
        raise ConfigError(f"{key}: expected a mapping with a 'size' name, got {raw!r}")
    allowed = {"size", "lr", "weight_decay", "beta2"} if index == 0 else {"size", "parents", "beta2"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        names = ", ".join(sorted(allowed))
        raise ConfigError(f"{key}: unknown key(s) {', '.join(unknown)} (allowed: {names})")
    if index == 0:
        return StageConfig(
            size=raw["size"],
            lr=_numbers(raw.get("lr"), f"{key}.lr", positive=True),
            weight_decay=_numbers(raw.get("weight_decay", [0.1]), f"{key}.weight_decay", positive=False),
            beta2=_numbers(raw.get("beta2", [0.95]), f"{key}.beta2", positive=False),
        )
    parents = raw.get("parents")
    if isinstance(parents, bool) or not isinstance(parents, int) or parents < 1:
        raise ConfigError(f"{key}.parents: expected a positive integer, got {parents!r}")
    beta2 = _numbers(raw["beta2"], f"{key}.beta2", positive=False) if raw.get("beta2") is not None else ()
    return StageConfig(size=raw["size"], parents=parents, beta2=beta2)


def parse_campaign(
    section: Mapping[str, Any], sizes: Mapping[str, Any], root: str, numerics_version: int = 0
) -> CampaignConfig:
    """Validate the workflow's ``campaign`` section against its ``sizes`` (ConfigError on a problem)."""
    raw_stages = section.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise ConfigError("campaign.stages: expected a non-empty list of stages")
    stages = tuple(_stage(raw, i) for i, raw in enumerate(raw_stages))
    used = [s.size for s in stages]
    for i, stage in enumerate(stages):
        if stage.size not in sizes:
            raise ConfigError(
                f"campaign.stages[{i}].size: unknown size '{stage.size}' (sizes: {', '.join(sorted(sizes))})"
            )
        if i and stage.parents > len(stage_run_ids_of(stages, i - 1)):
            raise ConfigError(
                f"campaign.stages[{i}].parents: {stage.parents} exceeds the "
                f"{len(stage_run_ids_of(stages, i - 1))} runs of {stage_name(i - 1)}"
            )
    for key in ("batch_tokens", "tuning", "throughput"):
        extra = sorted(set(section.get(key) or {}) - set(used))
        if extra:
            raise ConfigError(f"campaign.{key}: size(s) {', '.join(extra)} are not in campaign.stages")
    return CampaignConfig(
        root=root.rstrip("/"),
        stages=stages,
        sizes={name: sizes[name] for name in dict.fromkeys(used)},
        overrides=dict(section.get("overrides") or {}),
        batch_tokens=dict(section.get("batch_tokens") or {}),
        tuning=dict(section.get("tuning") or {}),
        throughput={k: float(v) for k, v in (section.get("throughput") or {}).items()},
        numerics_version=numerics_version,
    )


def settings_dict(config: CampaignConfig) -> dict[str, Any]:
    """A JSON-ready form of the settings (what the workflow hands to the CLI)."""
    return {
        "root": config.root,
        "stages": [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(s).items() if v not in ((), 0)}
            for s in config.stages
        ],
        "sizes": {k: dict(v) for k, v in config.sizes.items()},
        "overrides": dict(config.overrides),
        "batch_tokens": dict(config.batch_tokens),
        "tuning": dict(config.tuning),
        "throughput": dict(config.throughput),
        "numerics_version": config.numerics_version,
    }


def config_from_settings(settings: Mapping[str, Any]) -> CampaignConfig:
    """Inverse of ``settings_dict``."""
    section = {k: settings.get(k) for k in ("stages", "overrides", "batch_tokens", "tuning", "throughput")}
    return parse_campaign(section, settings["sizes"], settings["root"], settings.get("numerics_version", 0))


# ----------------------------------------------------------------------------- run ids


def format_value(value: float) -> str:
    """Short, stable number text for run ids: 0.001, 0.0003, 0, 0.95, 1e-05."""
    return f"{value:.10g}"


@dataclass(frozen=True)
class PlannedRun:
    """One run of a stage, known before anything trains."""

    run_id: str
    stage: str
    size: str
    optimizer: Mapping[str, float]
    """Stage 1: the grid point; later stages: the values set on top of the parent's optimizer block."""
    parent_rank: int | None = None
    """Later stages: rank (0 = best) of the parent in the previous stage."""


def _stage_runs(stages: Sequence[StageConfig], index: int) -> list[PlannedRun]:
    stage, name = stages[index], stage_name(index)
    if index == 0:
        many_beta2 = len(stage.beta2) > 1
        runs = []
        for lr, wd, beta2 in itertools.product(stage.lr, stage.weight_decay, stage.beta2):
            run_id = f"{stage.size}-lr{format_value(lr)}-wd{format_value(wd)}"
            if many_beta2:
                run_id += f"-beta2-{format_value(beta2)}"
            runs.append(PlannedRun(run_id, name, stage.size, {"lr": lr, "weight_decay": wd, "beta2": beta2}))
        return runs
    runs = []
    for rank in range(stage.parents):
        if not stage.beta2:
            runs.append(PlannedRun(f"{stage.size}-parent{rank}", name, stage.size, {}, rank))
        for beta2 in stage.beta2:
            run_id = f"{stage.size}-parent{rank}-beta2-{format_value(beta2)}"
            runs.append(PlannedRun(run_id, name, stage.size, {"beta2": beta2}, rank))
    return runs


def stage_run_ids_of(stages: Sequence[StageConfig], index: int) -> list[str]:
    return [run.run_id for run in _stage_runs(stages, index)]


def planned_runs(config: CampaignConfig) -> dict[str, list[PlannedRun]]:
    """Stage name -> its runs, in grid / parent-rank order."""
    return {stage_name(i): _stage_runs(config.stages, i) for i in range(len(config.stages))}


def run_dir(config: CampaignConfig, stage: str, run_id: str) -> str:
    return f"{config.root}/{stage}/{run_id}"


def recipe_path(config: CampaignConfig, stage: str, run_id: str) -> str:
    return f"{config.root}/recipes/{stage}/{run_id}.yaml"


def template_path(config: CampaignConfig, size: str) -> str:
    return f"{config.root}/templates/{size}.yaml"


def ranking_path(config: CampaignConfig, stage: str) -> str:
    return f"{config.root}/{stage}/ranking.json"


# ----------------------------------------------------------------------------- templates


def size_base(entry: Mapping[str, Any], size: str) -> dict[str, Any]:
    """A size entry ``{preset: NAME, overrides: {...}}`` -> merged recipe mapping."""
    preset = entry.get("preset")
    base = read_config_source(str(preset)) if preset else {}
    return deep_merge(base, dict(entry.get("overrides") or {}))


def tuned_settings(
    tuning_recipe: Mapping[str, Any], template: Mapping[str, Any], size: str, source: str
) -> dict[str, dict[str, Any]]:
    """The execution settings a tuning result gives a size; ConfigError if it tuned another model."""
    tuned = recipe_to_dict(recipe_from_dict(dict(tuning_recipe)))
    if tuned["model"] != template["model"]:
        diffs = identity_differences(template["model"], tuned["model"])
        raise ConfigError(
            f"campaign.tuning.{size}: {source} tuned another model shape ({'; '.join(diffs[:3])}); "
            f"tune the size's own preset or drop it from campaign.tuning"
        )
    settings: dict[str, dict[str, Any]] = {}
    for section, name in TUNED_FIELDS:
        settings.setdefault(section, {})[name] = tuned[section][name]
    return settings


def build_template(
    config: CampaignConfig, size: str, tuning_recipe: Mapping[str, Any] | None = None, source: str = ""
) -> dict[str, Any]:
    """The complete recipe every run of ``size`` starts from (before its optimizer values and run dir)."""
    data = deep_merge(size_base(config.sizes[size], size), dict(config.overrides))
    if size in config.batch_tokens:
        data = deep_merge(data, {"training": {"batch_tokens": config.batch_tokens[size]}})
    template = recipe_to_dict(_validated(data, f"campaign template for size '{size}'"))
    if tuning_recipe is not None:
        for section, values in tuned_settings(tuning_recipe, template, size, source).items():
            template[section].update(values)
        template = recipe_to_dict(_validated(template, f"size '{size}' with the tuning result {source}"))
    template["runtime"]["output_dir"] = f"{config.root}/templates/{size}"
    return template


def _validated(data: dict[str, Any], what: str):
    try:
        return recipe_from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


def _run_recipe(template: Mapping[str, Any], optimizer: Mapping[str, Any], out_dir: str) -> dict[str, Any]:
    recipe = deep_merge(dict(template), {"optimizer": dict(optimizer), "runtime": {"output_dir": out_dir}})
    return recipe_to_dict(_validated(recipe, f"campaign run {out_dir}"))


def stage1_recipes(config: CampaignConfig, template: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Run id -> complete recipe for every grid point of stage 1."""
    runs = planned_runs(config)[stage_name(0)]
    return {r.run_id: _run_recipe(template, r.optimizer, run_dir(config, r.stage, r.run_id)) for r in runs}


def child_recipes(
    config: CampaignConfig,
    stage_index: int,
    template: Mapping[str, Any],
    parents: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Run id -> recipe for a later stage: each parent's whole optimizer block, then the stage's values.

    ``parents`` are the previous stage's recipes in rank order (0 = best).
    """
    runs = planned_runs(config)[stage_name(stage_index)]
    needed = config.stages[stage_index].parents
    if len(parents) < needed:
        raise RunStateError(f"{stage_name(stage_index)} needs {needed} parents, got {len(parents)}")
    out = {}
    for run in runs:
        optimizer = {**parents[run.parent_rank]["optimizer"], **run.optimizer}
        out[run.run_id] = _run_recipe(template, optimizer, run_dir(config, run.stage, run.run_id))
    return out


# ----------------------------------------------------------------------------- ranking


@dataclass(frozen=True)
class RunOutcome:
    """What ranking needs from one finished run."""

    run_id: str
    loss: float
    """Final full-validation loss (inf when missing or not finite)."""
    lr: float
    weight_decay: float
    beta2: float


def rank_key(outcome: RunOutcome) -> tuple[float, float, float, float, str]:
    """Lower final loss first; ties -> lower lr, then lower weight decay, then lower beta2."""
    return (outcome.loss, outcome.lr, outcome.weight_decay, outcome.beta2, outcome.run_id)


def rank_runs(outcomes: Iterable[RunOutcome]) -> list[RunOutcome]:
    return sorted(outcomes, key=rank_key)


def final_loss(result: Mapping[str, Any]) -> float:
    """result.json's final full-validation loss; inf if absent or not finite, so such runs rank last."""
    loss = (result.get("final_validation") or {}).get("loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        return math.inf
    return float(loss)


def outcome_from(run_id: str, result: Mapping[str, Any], recipe: Mapping[str, Any]) -> RunOutcome:
    opt = recipe["optimizer"]
    return RunOutcome(run_id, final_loss(result), opt["lr"], opt["weight_decay"], opt["beta2"])


def load_outcome(run_id: str, result_file: str | Path, recipe_file: str | Path) -> RunOutcome:
    recipe = yaml.safe_load(Path(recipe_file).read_text(encoding="utf-8"))
    return outcome_from(run_id, read_json(result_file), recipe)


def ranking_rows(ranked: Sequence[RunOutcome]) -> list[dict[str, Any]]:
    """JSON rows of a stage ranking (loss null where it was missing)."""
    return [
        {
            "rank": i,
            "run": o.run_id,
            "loss": o.loss if math.isfinite(o.loss) else None,
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "beta2": o.beta2,
        }
        for i, o in enumerate(ranked)
    ]


def diverged_result(run_dir: str | Path, exit_code: int) -> dict[str, Any] | None:
    """The result.json of a run that stopped on a non-finite loss or norm, or None for any other failure.

    A diverged grid point is an outcome of the campaign (it ranks last), not a reason to stop promoting the
    others; crashes, interruptions and user errors are not outcomes and still fail the job.
    """
    status_file = Path(run_dir) / "status.json"
    if exit_code != 1 or not status_file.is_file():
        return None
    status = read_json(status_file)
    if status.get("status") != "failed" or "non-finite" not in str(status.get("error", "")):
        return None
    return {
        "status": "diverged",
        "error": status["error"],
        "step": status.get("step"),
        "tokens": status.get("tokens"),
        "final_validation": None,
    }


# ----------------------------------------------------------------------------- identity


def campaign_identity_payload(
    config: CampaignConfig, templates: Mapping[str, Mapping[str, Any]], cache_identities: Mapping[str, str]
) -> dict[str, Any]:
    """What makes two campaigns the same: stages, grids, templates (numerics only) and token caches."""
    return {
        "format": CAMPAIGN_FORMAT,
        "numerics_version": config.numerics_version,
        "stages": settings_dict(config)["stages"],
        "templates": {s: recipe_identity_payload(recipe_from_dict(dict(t))) for s, t in templates.items()},
        "cache_identities": dict(cache_identities),
    }


def campaign_identity(payload: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def check_unchanged(root: str | Path, payload: Mapping[str, Any]) -> bool:
    """True if ``root`` already records this campaign, False if it records none yet.

    Raises CampaignChangedError (naming what changed) if it records another one.
    """
    record = Path(root) / IDENTITY_FILE
    if not record.is_file():
        return False
    old = read_json(record)
    if old.get("identity") == campaign_identity(payload):
        return True
    diffs = identity_differences(old.get("payload") or {}, dict(payload))
    shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    raise CampaignChangedError(f"{CHANGED_MESSAGE} ({root}: {shown or 'identity differs'})")


def identity_record(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {"identity": campaign_identity(payload), "payload": dict(payload)}


# ----------------------------------------------------------------------------- estimate


def gpu_hour_estimate(
    config: CampaignConfig,
    templates: Mapping[str, Mapping[str, Any]],
    throughput: Mapping[str, float | None],
) -> dict[str, Any]:
    """Runs x realized tokens / tokens per second, per stage and in total (null where tokens/s is unknown)."""
    stages = []
    for i, stage in enumerate(config.stages):
        num_runs = len(stage_run_ids_of(config.stages, i))
        tokens = make_budget(recipe_from_dict(dict(templates[stage.size]))).tokens
        rate = throughput.get(stage.size)
        hours = num_runs * tokens / rate / 3600.0 if rate else None
        stages.append(
            {
                "stage": stage_name(i),
                "size": stage.size,
                "runs": num_runs,
                "tokens_per_run": tokens,
                "tokens_per_second": rate,
                "gpu_hours": hours,
            }
        )
    known = all(s["gpu_hours"] is not None for s in stages)
    return {"stages": stages, "total_gpu_hours": sum(s["gpu_hours"] for s in stages) if known else None}


def describe_estimate(estimate: Mapping[str, Any]) -> str:
    """One human line per stage plus the total."""
    lines = []
    for s in estimate["stages"]:
        hours = f"{s['gpu_hours']:.3f} GPU-h" if s["gpu_hours"] is not None else "unknown (no tokens/s)"
        lines.append(f"{s['stage']}: {s['runs']} x {s['size']} x {s['tokens_per_run']:,} tokens -> {hours}")
    total = estimate["total_gpu_hours"]
    lines.append(f"campaign total: {total:.3f} GPU-h" if total is not None else "campaign total: unknown")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- files


def _read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping")
    return data


def tuned_throughput(selected_file: str | Path) -> float | None:
    """Tokens/s of the selected candidate, from the ``summary.json`` beside a tuning ``selected.yaml``."""
    summary_file = Path(selected_file).with_name("summary.json")
    if not summary_file.is_file():
        return None
    summary = read_json(summary_file)
    selected = summary.get("selected")
    if isinstance(selected, dict):
        rate = selected.get("tokens_per_second")
        if rate is None and isinstance(selected.get("result"), dict):
            rate = selected["result"].get("tokens_per_second")
        return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
    for candidate in summary.get("candidates") or []:
        names = {candidate.get(k) for k in ("name", "id", "candidate")}
        if selected is not None and selected in names:
            rate = candidate.get("tokens_per_second")
            return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None
    return None


def load_templates(config: CampaignConfig) -> dict[str, dict[str, Any]]:
    """Size -> template, reading each size's tuning result where campaign.tuning names one."""
    templates = {}
    for size in config.sizes:
        source = config.tuning.get(size)
        tuning = _read_yaml(source) if source else None
        templates[size] = build_template(config, size, tuning, source or "")
    return templates


def cache_identity_of(template: Mapping[str, Any]) -> str:
    """Identity of the token cache a template trains on (RunStateError if it is not prepared yet)."""
    manifest = Path(template["data"]["cache_dir"]) / "manifest.json"
    if not manifest.is_file():
        raise RunStateError(f"token cache not prepared: {manifest} is missing; prepare it first")
    identity = read_json(manifest).get("identity")
    if not isinstance(identity, str):
        raise RunStateError(f"{manifest}: no identity field; prepare the cache again")
    return identity


@dataclass(frozen=True)
class Plan:
    """Everything the plan step writes."""

    templates: dict[str, dict[str, Any]]
    payload: dict[str, Any]
    stage1: dict[str, dict[str, Any]]
    estimate: dict[str, Any]


def planned_throughput(config: CampaignConfig) -> dict[str, float | None]:
    """Tokens/s per size: the tuning result's measured figure, else campaign.throughput, else unknown."""
    throughput = {size: config.throughput.get(size) for size in config.sizes}
    for size, source in config.tuning.items():
        throughput[size] = tuned_throughput(source) or throughput[size]
    return throughput


def estimate_only(config: CampaignConfig) -> dict[str, Any]:
    """The GPU-hour estimate before anything exists (no cache needed; tuning results used where present)."""
    templates = {}
    for size in config.sizes:
        source = config.tuning.get(size)
        tuning = _read_yaml(source) if source and Path(source).is_file() else None
        templates[size] = build_template(config, size, tuning, source or "")
    return gpu_hour_estimate(config, templates, planned_throughput(config))


def make_plan(config: CampaignConfig) -> Plan:
    templates = load_templates(config)
    caches = {size: cache_identity_of(t) for size, t in templates.items()}
    payload = campaign_identity_payload(config, templates, caches)
    estimate = gpu_hour_estimate(config, templates, planned_throughput(config))
    return Plan(templates, payload, stage1_recipes(config, templates[config.stages[0].size]), estimate)


def precheck(config: CampaignConfig) -> None:
    """Reject changed settings before a workflow touches anything (a no-op while inputs are missing)."""
    if not (Path(config.root) / IDENTITY_FILE).is_file():
        return
    try:
        templates = load_templates(config)
        caches = {size: cache_identity_of(t) for size, t in templates.items()}
    except (ConfigError, RunStateError):
        return  # the plan step reports these with their own message once its inputs exist
    check_unchanged(config.root, campaign_identity_payload(config, templates, caches))


def campaign_record(config: CampaignConfig, plan: Plan) -> dict[str, Any]:
    """campaign.json: identity, settings, templates, every run id and the GPU-hour estimate."""
    return {
        "identity": campaign_identity(plan.payload),
        "settings": settings_dict(config),
        "cache_identities": plan.payload["cache_identities"],
        "templates": {size: template_path(config, size) for size in plan.templates},
        "stages": [
            {
                "stage": stage,
                "size": runs[0].size,
                "runs": [r.run_id for r in runs],
                "parents": config.stages[i].parents or None,
            }
            for i, (stage, runs) in enumerate(planned_runs(config).items())
        ],
        "gpu_hour_estimate": plan.estimate,
    }


def _stage_outcomes(config: CampaignConfig, index: int) -> tuple[list[RunOutcome], dict[str, dict]]:
    stage = stage_name(index)
    outcomes, recipes = [], {}
    for run in planned_runs(config)[stage]:
        result_file = Path(run_dir(config, stage, run.run_id)) / "result.json"
        if not result_file.is_file():
            raise RunStateError(f"{stage} is not finished: {result_file} is missing")
        recipes[run.run_id] = _read_yaml(recipe_path(config, stage, run.run_id))
        outcomes.append(outcome_from(run.run_id, read_json(result_file), recipes[run.run_id]))
    return outcomes, recipes


def rank_stage(config: CampaignConfig, index: int) -> list[RunOutcome]:
    """The finished runs of stage ``index`` (0-based), best first."""
    return rank_runs(_stage_outcomes(config, index)[0])


def select_children(config: CampaignConfig, stage_index: int) -> tuple[list[RunOutcome], dict[str, dict]]:
    """Rank the stage before ``stage_index`` (0-based) and build that stage's recipes from its files."""
    outcomes, recipes = _stage_outcomes(config, stage_index - 1)
    ranked = rank_runs(outcomes)
    template = _read_yaml(template_path(config, config.stages[stage_index].size))
    parents = [recipes[o.run_id] for o in ranked]
    return ranked, child_recipes(config, stage_index, template, parents)
