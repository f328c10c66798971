"""Tuning profiles and the staged candidate schedule (torch-free; the Snakefile imports it).

A profile fixes a base recipe, a device kind and a candidate space. The schedule
(plan.json) is a fixed, ordered list of *slots*: stage 1 lists concrete settings, compiled ones
first, later stages apply variants to the parent of a given *rank* among everything measured
before them (top 2, then the best). Because slots name ranks, not settings,
every file of the tuning DAG is known before anything runs. A GPU profile's last stage tries the whole-update
CUDA graph (runtime.cuda_graph) on the best so far, where that recipe can take it (``CONDITIONAL_STAGES``).

Ranking is noise-aware (``NOISE_RULE``): a candidate moves above an earlier one only when it is faster
by more than the spread of its own timing windows, so the earlier, simpler candidate (stage 1's first
compiled setting, or the parent a later stage's variants are applied to) is kept otherwise.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tiny_llm.campaign.templates import TUNED_KEYS
from tiny_llm.config import RecipeConfig, load_recipe, recipe_from_dict, recipe_to_dict
from tiny_llm.errors import ConfigError
from tiny_llm.io import canonical_json
from tiny_llm.typed import NON_NEGATIVE, POSITIVE, typed_from_dict

# Stage 1, (micro_batch_size, compiled): the reference's order, then larger compiled microbatches up to the
# reference's 20m production setting (micro 128 at 131,072 tokens). Micro batches above one update are
# skipped, so at 32,768 tokens (50m, 90m) this is the reference's list.
REFERENCE_STAGE1: tuple[tuple[int, bool], ...] = (
    (8, False),
    (8, True),
    (16, True),
    (4, False),
    (4, True),
    (16, False),
    (32, False),
    (32, True),
    (64, True),
    (128, True),
)


SpaceKind = Literal["gpu", "cpu"]
AttentionLabel = Literal["auto", "flash", "cudnn", "efficient", "math", "reference"]


@dataclass(frozen=True)
class Variant:
    """One change to a parent recipe, with a short file-name-safe label."""

    label: str
    overrides: dict[str, Any]


@dataclass(frozen=True)
class StageSpec:
    """``variants`` applied to each of the ``top_k`` best earlier candidates (top_k 0: the base recipe)."""

    name: str
    top_k: int
    variants: tuple[Variant, ...]


@dataclass(frozen=True)
class Slot:
    """One candidate job of the schedule."""

    name: str
    stage: int
    stage_name: str
    parent_rank: int | None
    """Rank (0 = best) among earlier stages' candidates; None = applied to the base recipe."""
    overrides: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class TuningProfile:
    """A resolved tuning profile (one entry of the workflow config's ``tuning.profiles``)."""

    name: str
    configs: tuple[str, ...]
    """Recipe presets or YAML files, merged in order."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Recipe keys (a nested mapping) merged over ``configs``."""
    space: SpaceKind = "gpu"
    require_gpu_name: str | None = None
    """The worker refuses a GPU whose name lacks this text (unless allow_other_gpu)."""
    allow_other_gpu: bool = False
    budget_minutes: float = field(default=75.0, metadata=POSITIVE)
    candidate_timeout_seconds: float = field(default=600.0, metadata=POSITIVE)
    min_start_seconds: float = field(default=60.0, metadata=NON_NEGATIVE)
    """No new candidate starts with less budget left than this."""
    warmup: int = field(default=20, metadata=POSITIVE)
    steps: int = field(default=100, metadata=POSITIVE)
    windows: int = field(default=3, metadata=POSITIVE)
    data_mode: Literal["real", "synthetic"] = "real"
    stage1: tuple[tuple[int, bool], ...] = REFERENCE_STAGE1
    attention_variants: tuple[AttentionLabel, ...] | None = None
    """Stage 2 labels; default flash/cudnn on GPU, math/reference on CPU."""
    compile_modes: tuple[str, ...] = ("reduce-overhead", "max-autotune")
    cpu_amp_variants: tuple[bool, ...] = (True, False)
    threads: tuple[int, ...] = field(default=(1, 4, 8), metadata=POSITIVE)
    """Stage 4 (cpu space only: a GPU profile has no threads stage)."""
    cuda_graph: bool = True
    """Stage 4 on gpu: the best so far with runtime.cuda_graph true; false leaves it out (none on cpu)."""


def profile_from_dict(name: str, data: dict[str, Any]) -> TuningProfile:
    """Build a profile from its workflow-config mapping; one ConfigError line names each bad key."""
    where = f"tuning.profiles.{name}"
    if isinstance(data.get("configs"), str):  # one preset or file, as on the command line
        data = {**data, "configs": [data["configs"]]}
    profile = typed_from_dict(TuningProfile, {**data, "name": name}, where)
    problems = profile_problems(profile)
    if problems:
        raise ConfigError("; ".join(f"{where}.{problem}" for problem in problems))
    return profile


def profile_problems(p: TuningProfile) -> list[str]:
    """The lists no tuner run could use, each ``key: what is wrong`` (types and ranges are the builder's)."""
    problems = []
    if not p.configs:
        problems.append("configs: name at least one recipe preset or file")
    if not p.stage1:
        problems.append("stage1: needs at least one (micro_batch_size, compile) pair")
    return problems


def base_recipe(profile: TuningProfile) -> RecipeConfig:
    """The profile's recipe before any candidate change."""
    return load_recipe(list(profile.configs), overrides=profile.overrides)


# ----------------------------------------------------------------------------- stages

CUDA_GRAPH = Variant("cuda-graph", {"runtime.cuda_graph": True})
"""The GPU space's last stage (cuda_graph): the whole update captured as one CUDA graph and replayed."""

CONDITIONAL_STAGES = frozenset({"cuda_graph"})
"""Stages whose variant is tried only on a parent whose recipe can take it. runtime.cuda_graph needs the fused
optimizer, deterministic false and, when compiled, compile_mode default (recipe validation), so on any other
parent (e.g. a max-autotune winner of stage 3) the slot measures nothing: it is skipped, saying why, and the
parent stays the best. A variant of another stage that the recipe refuses is a failed candidate."""


def _attention_variant(label: str) -> Variant:
    if label == "reference":
        return Variant("reference", {"runtime.attention_backend": "reference"})
    return Variant(label, {"runtime.attention_backend": "sdpa", "runtime.sdpa_backend": label})


def compiled_first(pairs: tuple[tuple[int, bool], ...]) -> tuple[tuple[int, bool], ...]:
    """Stage 1's (micro_batch_size, compiled) pairs, compiled ones first, each group in the given order:
    compiled is the default starting point, so the first compiled setting is the baseline that an eager one
    must beat by more than its noise, and a budget that runs out leaves the eager ones unmeasured."""
    return tuple(sorted(pairs, key=lambda pair: not pair[1]))


def stage_specs(profile: TuningProfile, batch_sequences: int) -> list[StageSpec]:
    """The profile's stages, in run order:

    1. micro batch x compile, compiled settings first, skipping micro batches larger than one update;
    2. attention kernels, for the top 2;
    3. compile modes (GPU) or BF16 autocast on and off (CPU), for the best;
    4. the CUDA graph (GPU, unless the profile leaves it out) or thread counts (CPU), for the best.
    """
    stage1 = tuple(
        Variant(
            f"m{micro}-{'compile' if compiled else 'eager'}",
            {"training.micro_batch_size": micro, "runtime.compile": compiled},
        )
        for micro, compiled in compiled_first(profile.stage1)
        if micro <= batch_sequences
    )
    if not stage1:
        raise ConfigError(
            f"tuning.profiles.{profile.name}.stage1: every micro batch exceeds the {batch_sequences} "
            "sequences of one update (training.batch_tokens)"
        )
    default_attention = ("flash", "cudnn") if profile.space == "gpu" else ("math", "reference")
    chosen = default_attention if profile.attention_variants is None else profile.attention_variants
    attention = tuple(_attention_variant(a) for a in chosen)
    threads = tuple(Variant(f"t{n}", {"runtime.cpu_threads": n}) for n in profile.threads)
    if profile.space == "gpu":
        third = StageSpec(
            "compile_mode",
            1,
            tuple(
                Variant(mode, {"runtime.compile": True, "runtime.compile_mode": mode})
                for mode in profile.compile_modes
            ),
        )
    else:
        third = StageSpec(
            "precision",
            1,
            tuple(Variant("bf16" if a else "fp32", {"runtime.cpu_amp": a}) for a in profile.cpu_amp_variants),
        )
    stages = [StageSpec("micro_compile", 0, stage1), StageSpec("attention", 2, attention), third]
    if profile.space == "cpu":  # torch's CPU threads do not change a GPU update's speed
        stages.append(StageSpec("threads", 1, threads))
    elif profile.cuda_graph:  # a CPU cannot capture one: CUDA only
        stages.append(StageSpec("cuda_graph", 1, (CUDA_GRAPH,)))
    return stages


def make_slots(profile: TuningProfile, recipe: RecipeConfig) -> list[Slot]:
    """Every candidate slot in run order."""
    batch_sequences = recipe.training.batch_tokens // recipe.model.context_length
    slots = []
    for number, spec in enumerate(stage_specs(profile, batch_sequences), start=1):
        ranks: list[int | None] = [None] if spec.top_k == 0 else list(range(spec.top_k))
        for rank in ranks:
            for variant in spec.variants:
                prefix = f"s{number}" if rank is None else f"s{number}-r{rank}"
                slots.append(Slot(f"{prefix}-{variant.label}", number, spec.name, rank, variant.overrides))
    return slots


def slot_names(profile: TuningProfile) -> list[str]:
    """Slot names for the Snakefile (a static DAG)."""
    return [s.name for s in make_slots(profile, base_recipe(profile))]


# ----------------------------------------------------------------------------- schedule


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """How every candidate is measured."""

    warmup: int
    steps: int
    windows: int
    data_mode: str


REPLAN = "a plan written by another version? delete it and rerun: `tiny-llm tune plan` writes it again"
"""What to do with a plan.json this version cannot use (docs/architecture.md, Results of earlier versions)."""


@dataclass(frozen=True, kw_only=True)
class TuningSchedule:
    """Everything a candidate job needs; written once as plan.json."""

    profile: str
    space: str
    base_recipe: dict[str, Any]
    slots: list[Slot]
    protocol: Protocol
    budget_seconds: float
    candidate_timeout_seconds: float
    min_start_seconds: float
    require_gpu_name: str | None = None
    allow_other_gpu: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def slot(self, name: str) -> Slot:
        for slot in self.slots:
            if slot.name == name:
                return slot
        raise ConfigError(f"tuning slot '{name}' is not in the plan of profile {self.profile}; {REPLAN}")


def make_plan(profile: TuningProfile) -> TuningSchedule:
    recipe = base_recipe(profile)
    return TuningSchedule(
        profile=profile.name,
        space=profile.space,
        base_recipe=recipe_to_dict(recipe),
        slots=make_slots(profile, recipe),
        protocol=Protocol(
            warmup=profile.warmup, steps=profile.steps, windows=profile.windows, data_mode=profile.data_mode
        ),
        budget_seconds=profile.budget_minutes * 60.0,
        candidate_timeout_seconds=profile.candidate_timeout_seconds,
        min_start_seconds=profile.min_start_seconds,
        require_gpu_name=profile.require_gpu_name,
        allow_other_gpu=profile.allow_other_gpu,
    )


def plan_from_dict(data: dict[str, Any]) -> TuningSchedule:
    """A plan read back from plan.json. A key the schedule does not have is refused (ConfigError naming it):
    the file holds settings only, never a command, and one written by another version is planned anew."""
    unknown = sorted(set(data) - set(TuningSchedule.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"tuning plan: unknown key '{unknown[0]}'; {REPLAN}")
    slots = [Slot(**s) for s in data["slots"]]
    return TuningSchedule(**{**data, "slots": slots, "protocol": Protocol(**data["protocol"])})


# ----------------------------------------------------------------------------- recipes, identity, ranking


def apply_overrides(recipe: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Copy of a recipe dict with dotted-key overrides; validated as a recipe."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in recipe.items()}
    for key, value in overrides.items():
        section, name = key.split(".", 1)
        data[section][name] = value
    return recipe_to_dict(recipe_from_dict(data))


def candidate_identity(recipe: dict[str, Any], protocol: Protocol) -> str:
    """Two candidates with the same identity would measure the same thing: run one, reuse it."""
    runtime = {k: v for k, v in recipe["runtime"].items() if k != "output_dir"}
    payload = {"recipe": {**recipe, "runtime": runtime}, "protocol": asdict(protocol)}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def tuned_settings(recipe: dict[str, Any]) -> dict[str, Any]:
    """Every tuned key of a recipe dict (a candidate's record; a campaign takes only some of them)."""
    out = {}
    for key in TUNED_KEYS:
        section, name = key.split(".", 1)
        out[key] = recipe[section][name]
    return out


NOISE_RULE = (
    "candidates in run order; each is placed just above the first candidate already ranked that it beats by "
    "more than its own noise (median-window tokens/s minus the other's > the spread, max - min, of its own "
    "windows' tokens/s), else last: a candidate faster within its noise keeps the earlier one (the stage's "
    "baseline: stage 1's first compiled setting, or the parent of a later stage's variants) above it"
)


def window_noise(window_tokens_per_second: list[float] | None) -> float:
    """A candidate's noise: the spread (max - min) of its windows' tokens/s; 0 with fewer than 2 windows."""
    rates = [float(r) for r in window_tokens_per_second or []]
    return max(rates) - min(rates) if len(rates) >= 2 else 0.0


def _noise(result: dict[str, Any]) -> float:
    return float(result.get("noise_tokens_per_second") or 0.0)


def _tps(result: dict[str, Any]) -> float:
    return float(result["tokens_per_second"])


def clearly_faster(challenger: dict[str, Any], incumbent: dict[str, Any]) -> bool:
    """Whether ``challenger`` beats ``incumbent`` by more than the noise of its own windows."""
    return _tps(challenger) - _tps(incumbent) > _noise(challenger)


def _distinct_successes(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    unique = []
    for result in results:
        if result.get("status") != "ok" or result["identity"] in seen:
            continue
        seen.add(result["identity"])
        unique.append(result)
    return unique


def rank_with_decisions(results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(successful distinct candidates best first under NOISE_RULE, one decision per candidate in run order:
    where it was placed when measured, the candidate kept above it and its margin over that one)."""
    ranked: list[dict[str, Any]] = []
    decisions = []
    for result in _distinct_successes(results):
        place = next((i for i, other in enumerate(ranked) if clearly_faster(result, other)), len(ranked))
        above = ranked[place - 1] if place else None
        beaten = ranked[place] if place < len(ranked) else None
        decisions.append(
            {
                "name": result["name"],
                "tokens_per_second": _tps(result),
                "noise_tokens_per_second": _noise(result),
                "rank_when_measured": place,
                "kept_above": None if above is None else above["name"],
                "margin_tokens_per_second": None if above is None else _tps(result) - _tps(above),
                "beat": None if beaten is None else beaten["name"],
                "decision": _decision_text(result, above, beaten),
            }
        )
        ranked.insert(place, result)
    return ranked, decisions


def _decision_text(
    result: dict[str, Any], above: dict[str, Any] | None, beaten: dict[str, Any] | None
) -> str:
    noise = f"its window noise {_noise(result):.4g} tokens/s"
    if above is not None:
        margin = _tps(result) - _tps(above)
        how = f"faster by {margin:.4g} tokens/s, within {noise}" if margin > 0 else "slower"
        return f"kept below {above['name']}: {how}"
    if beaten is None:
        return "first candidate"
    margin = _tps(result) - _tps(beaten)
    return f"ranks first: faster than {beaten['name']} by {margin:.4g} tokens/s, more than {noise}"


def rank_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Successful, distinct candidates, best first under NOISE_RULE (without window data: fastest first, ties
    keep run order)."""
    return rank_with_decisions(results)[0]
