"""Typed, strict recipe configuration (torch-free).

A recipe is built from the defaults, then YAML files (``--config``, a path or
a shipped preset name) merged in order, then ``--set dotted.key=value``
overrides. Everything is validated once, after merging: unknown keys, wrong
types, non-finite numbers and impossible combinations are all collected and
reported as one line each, naming the key.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from tiny_llm.budget import budget_problems, make_budget, packed_epoch_problems, parameter_count
from tiny_llm.errors import ConfigError
from tiny_llm.io import LongIntegerError, canonical_json, parse_yaml
from tiny_llm.typed import FRACTION, MOMENTUM, NON_NEGATIVE, POSITIVE, build

C4_REVISION = "1588ec454efa1a09f29cd18ddd04fe05fc8653a2"
TINYLLAMA_TOKENIZER = "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"
TINYLLAMA_REVISION = "59f6f375b26bde864a6ca194a9a3044570490064"
TRACKING_ENV = "TINY_LLM_TRACKING"
"""A recipe ``tracking`` section as JSON, for runs whose recipe has none (the workflow sets it)."""


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Llama-style decoder shape (the 20M preset is the default)."""

    vocab_size: int = field(default=32000, metadata={**POSITIVE, "maximum": 65536})
    """Tokenizer size; must equal len(tokenizer); at most 65,536 (the token cache stores uint16 ids)."""
    num_layers: int = field(default=8, metadata=POSITIVE)
    """Transformer blocks."""
    width: int = field(default=320, metadata=POSITIVE)
    """Residual stream width d."""
    num_heads: int = field(default=5, metadata=POSITIVE)
    """Attention heads (KV heads = heads)."""
    ffn_width: int = field(default=896, metadata=POSITIVE)
    """SwiGLU hidden width f."""
    context_length: int = field(default=1024, metadata=POSITIVE)
    """Tokens per training block L."""
    rope_theta: float = field(default=10000.0, metadata=POSITIVE)
    """RoPE base."""
    norm_eps: float = field(default=1e-5, metadata=POSITIVE)
    """RMSNorm epsilon."""
    init_std: float = field(default=0.02, metadata=POSITIVE)
    """Std of the normal init of linears and the embedding."""


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Corpus, tokenizer and token cache."""

    cache_dir: str = "data/cache"
    """Token cache directory (immutable once complete; a leading ~ is the home directory)."""
    dataset: str = "allenai/c4"
    """'allenai/c4' (streamed from the hub) or a local directory in C4's en/ layout."""
    dataset_revision: str | None = C4_REVISION
    """Hub revision of the dataset; ignored for local directories."""
    tokenizer: str = TINYLLAMA_TOKENIZER
    """Hub id, or a local tokenizer.json / tokenizer.model / saved tokenizer directory."""
    tokenizer_revision: str | None = TINYLLAMA_REVISION
    """Hub revision of the tokenizer; ignored for local paths."""
    shuffle_seed: int = 42
    """Seed of the streaming shuffle of train documents."""
    shuffle_buffer: int = field(default=10000, metadata=POSITIVE)
    """Documents in the streaming shuffle buffer."""
    shard_tokens: int = field(default=16_777_216, metadata=POSITIVE)
    """Tokens per full cache shard."""
    tokenize_batch_size: int = field(default=256, metadata=POSITIVE)
    """Documents per tokenizer batch call."""
    prepare_workers: int = field(default=1, metadata={**POSITIVE, "maximum": 256})
    """Processes that tokenize for `prepare`, feeding one writer in order (the cache's bytes do not depend
    on it); 1 = tokenize in the preparing process; at most 256 (each one a process with a tokenizer)."""
    buffer_size_mib: int = field(default=64, metadata=POSITIVE)
    """Size of one contiguous loader read (and prefetch unit)."""
    prefetch: bool = True
    """Read the next loader range in a background thread."""
    shuffle_group_size: int | None = field(default=None, metadata={"late": True, "minimum": 1})
    """Loader v2: shuffle groups of this many physical shards, visited in file order, so a shorter run's
    samples are a prefix of a longer run's; null = loader v1 (ranges of buffer_size_mib in seeded order)."""
    prepare_train_tokens: int | None = None
    """Train tokens to cache; null = what the training budget needs (+1)."""
    prepare_validation_tokens: int | None = None
    """Truncate validation to this many tokens; null = all of it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", os.path.expanduser(self.cache_dir))  # ~ as in a shell


OptimizerName = Literal["adamw", "muon"]
"""The optimizers (the campaign's grid points and the workflow schema name the same)."""
OPTIMIZER_NAMES: tuple[str, ...] = typing.get_args(OptimizerName)


@dataclass(frozen=True, kw_only=True)
class MuonConfig:
    """Muon on the hidden matrices (``optimizer.name: muon`` only): torch's defaults, but the LR scale."""

    lr: float | None = field(default=None, metadata=POSITIVE)
    """Peak learning rate of the hidden matrices (the schedule scales it like optimizer.lr); null = lr."""
    momentum: float = field(default=0.95, metadata=MOMENTUM)
    """Momentum, in [0, 1)."""
    nesterov: bool = True
    """Nesterov momentum."""
    ns_steps: int = field(default=5, metadata={"minimum": 1, "maximum": 99})
    """Newton-Schulz iterations."""
    weight_decay: float | None = field(default=None, metadata=NON_NEGATIVE)
    """Decoupled decay of the hidden matrices (x muon.lr per update); null = optimizer.weight_decay."""
    adjust_lr_fn: Literal["original", "match_rms_adamw"] = "match_rms_adamw"
    """torch's per-matrix LR scale: original (sqrt(max(1, out/in))) or match_rms_adamw (0.2 sqrt(max(out,
    in)), so AdamW's lr and decay carry over)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The optimizer (AdamW, or Muon with AdamW) and the token-based learning-rate schedule.

    Under ``name: muon`` the AdamW keys (lr, beta1, beta2, eps, weight_decay) still apply, to the tied
    embedding/head and the RMSNorm scales; the ``muon`` section applies to the hidden matrices, and only under
    muon (set under adamw, it is refused). grad_clip and the schedule keys apply under both."""

    name: OptimizerName = field(default="adamw", metadata={"late": True})
    """adamw: AdamW on every parameter. muon: torch's Muon, batched per matrix shape, on the blocks' 2-D
    matrices (q/k/v/out, gate/up/down), AdamW on the embedding/head and norm scales (packed: batched over
    the workers too); not with runtime.cuda_graph."""
    lr: float = field(default=1e-3, metadata=POSITIVE)
    """Peak learning rate (AdamW's; under muon, of the embedding/head and norm scales)."""
    beta1: float = field(default=0.9, metadata=MOMENTUM)
    """AdamW (both names)."""
    beta2: float = field(default=0.95, metadata=MOMENTUM)
    """AdamW (both names)."""
    eps: float = field(default=1e-8, metadata=POSITIVE)
    """AdamW (both names)."""
    weight_decay: float = field(default=0.1, metadata=NON_NEGATIVE)
    """AdamW's decoupled decay on all >=2-D tensors (embedding included), none on norm scales (both names)."""
    muon: MuonConfig | None = field(default=None, metadata={"late": True})
    """Under muon: Muon's settings of the hidden matrices (null: its defaults, written out); refused under
    adamw."""
    grad_clip: float | None = field(default=1.0, metadata=POSITIVE)
    """Global L2 clip threshold; null = no clipping (the norm is still computed and logged)."""
    warmup_fraction: float = field(default=0.05, metadata=FRACTION)
    """Linear warmup over this fraction of the training tokens."""
    min_lr_ratio: float = field(default=0.1, metadata=FRACTION)
    """cosine only: final LR as a fraction of the peak (wsd decays to 0)."""
    lr_schedule: Literal["cosine", "wsd"] = field(default="cosine", metadata={"late": True})
    """cosine decay, or warmup-stable-decay."""
    decay_fraction: float = field(default=0.1, metadata={"late": True, **FRACTION})
    """wsd only: decay peak x (1 - sqrt(q)) to 0 over this last fraction of tokens."""
    warmup_steps: int | None = field(default=None, metadata={"late": True, **NON_NEGATIVE})
    """Linear warmup over this many full updates (warmup_steps x batch_tokens targets), independent of the
    total; exclusive with warmup_fraction (set it to 0). null = warmup_fraction."""

    def __post_init__(self) -> None:
        if self.name == "muon" and self.muon is None:  # Muon's settings, written out in the recipe
            object.__setattr__(self, "muon", MuonConfig())


@dataclass(frozen=True)
class OptimizerLabel:
    """What reports and rankings say of a run's optimizer: its name and, under muon, the peak LR of its hidden
    matrices (the effective one: muon.lr, else lr). AdamW sorts before Muon, then the lower Muon LR."""

    name: str = "adamw"
    muon_lr: float | None = None

    @classmethod
    def of(cls, optimizer: Mapping[str, Any]) -> OptimizerLabel:
        """The label of an optimizer block as a recipe file holds it."""
        name = str(optimizer.get("name") or "adamw")
        if name == "adamw":
            return cls()
        muon_lr = (optimizer.get("muon") or {}).get("lr")
        return cls(name, float(optimizer["lr"] if muon_lr is None else muon_lr))

    def sort_key(self) -> tuple[str, float]:
        return self.name, -math.inf if self.muon_lr is None else self.muon_lr

    def fields(self) -> dict[str, Any]:
        """A ranking row's fields (none for AdamW, whose rows are as they were before Muon)."""
        return {} if self.name == "adamw" else {"name": self.name, "muon_lr": self.muon_lr}

    def text(self) -> str:
        """A table's cell: 'adamw', or 'muon (muon_lr X)' (LR is then the AdamW rate of the embedding, the
        norms and the head)."""
        return self.name if self.muon_lr is None else f"{self.name} (muon_lr {self.muon_lr:.6g})"


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """Token budget, batch and checkpointing."""

    tokens_per_parameter: float = field(default=20.0, metadata=POSITIVE)
    """Training targets = this x parameters of one model."""
    epoch_tokens_per_parameter: float = field(default=0.5, metadata=POSITIVE)
    """Targets per virtual epoch = this x parameters."""
    batch_tokens: int = field(default=131_072, metadata={**POSITIVE, "maximum": 2**30})
    """Targets per optimizer update; at most 2**30 (1,073,741,824)."""
    micro_batch_size: int = field(default=128, metadata=POSITIVE)
    """Sequences per forward/backward microbatch."""
    checkpoint_policy: Literal["final", "none", "interval", "all"] = "final"
    """final | none | interval (rolling latest.pt) | all (interval + per-epoch files)."""
    checkpoint_every: int = field(default=500, metadata=POSITIVE)
    """Updates between rolling checkpoints (interval/all)."""
    checkpoint_epochs: list[int] | None = field(default=None, metadata={"minimum": 1})
    """Epochs (1-based) whose epoch-NNN.safetensors/.pt files are kept (policy interval or all); null = every
    epoch under policy all, none otherwise."""
    log_every: int = field(default=20, metadata=POSITIVE)
    """Updates between train metric rows."""
    data_passes: int = field(default=1, metadata={"late": True, **POSITIVE})
    """Passes over the training tokens: the run trains on the cache's first ceil(blocks / data_passes) blocks,
    each pass in its own seeded order. 1 (default): every training token is new; more repeats data on purpose
    (a small corpus), recorded in the recipe and its identity."""
    data_seed: int | None = field(default=None, metadata={"late": True, **NON_NEGATIVE})
    """Seed of the training data's order; null (default) = runtime.seed, which then seeds both the initial
    weights and the order. Set apart, the two sources of seed noise vary one at a time (a noise study)."""


@dataclass(frozen=True, kw_only=True)
class EvaluationConfig:
    """Validation subset and batching."""

    subset_blocks: int = field(default=1024, metadata=POSITIVE)
    """Full validation blocks in the per-epoch subset."""
    batch_size: int = field(default=128, metadata=POSITIVE)
    """Sequences per evaluation batch."""
    seed: int = 12345
    """numpy default_rng seed choosing the subset."""


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Execution settings; most of them are excluded from the recipe identity."""

    seed: int = 42
    """Model init and sample order."""
    deterministic: bool = False
    """Reference attention, no compile, no fused optimizer, deterministic algorithms."""
    device: str = "auto"
    """'auto' (CUDA when present), 'cpu', 'cuda' or 'cuda:N'."""
    amp: bool = True
    """BF16 autocast on CUDA."""
    cpu_amp: bool = False
    """BF16 autocast on CPU (faster only with AMX/AVX512-BF16)."""
    compile: bool = True
    """torch.compile the forward+loss of full microbatches."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"
    sdpa_backend: Literal["auto", "flash", "cudnn", "efficient", "math"] = "auto"
    """'auto' lets PyTorch choose; a named kernel disables the fallbacks."""
    attention_backend: Literal["sdpa", "reference"] = "sdpa"
    fused_optimizer: bool = True
    """Fused AdamW on CUDA."""
    cuda_graph: bool = field(default=False, metadata={"late": True})
    """Capture the whole update (forward, backward, clipping, fused AdamW) as one CUDA graph after a few
    eager updates and replay it; CUDA only, with the fused optimizer; short epoch-end updates run eagerly."""
    cpu_threads: int | None = field(default=8, metadata=POSITIVE)
    """torch threads; null = SLURM_CPUS_PER_TASK or all cores."""
    memory_limit_mb: int | None = field(default=None, metadata={**POSITIVE, "maximum": 2**24})
    """benchmark-worker only: MiB the measurement may allocate beyond what the process holds once its engine
    is built (CPU: the data segment; CUDA: the caching allocator's reservation); more raises an out-of-memory
    like CUDA's, and a peak at 90% of it is recorded as one. null = no cap; at most 2**24 (16 TiB, more than
    any machine holds)."""
    num_gpus: int = field(default=1, metadata={"minimum": 1})
    """Data-parallel ranks of one model (`tiny_llm launch --nproc-per-node num_gpus`, or torchrun; on the CPU,
    gloo processes): each takes its share of every update's microbatches; batch, budget and data order stay
    one process's."""
    output_dir: str = "runs/default"
    """Run directory (a leading ~ is the home directory)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_dir", os.path.expanduser(self.output_dir))  # never a ./~/ tree


@dataclass(frozen=True, kw_only=True)
class AdaptiveConsensusConfig:
    """Mixing strength gamma = (lr_t / lr_max) ** p after start_frac of the updates."""

    start_frac: float = field(default=0.5, metadata=FRACTION)
    p: float = field(default=1.0, metadata=NON_NEGATIVE)
    """0: gamma = 1 (full mixing)."""


@dataclass(frozen=True, kw_only=True)
class DecentralizedConfig:
    """Packed training of N models with decentralized mixing."""

    num_models: int = field(default=4, metadata={"minimum": 2})
    topology: Literal["complete", "one_peer_ring", "one_peer_exponential"] = "complete"
    scheme: Literal["awc", "atc"] = "awc"
    """awc: mix then step with pre-mix gradients; atc: step then mix."""
    adaptive_consensus: AdaptiveConsensusConfig | None = None


@dataclass(frozen=True, kw_only=True)
class WandbConfig:
    """A Weights & Biases run (``pip install -e ".[tracking]"``)."""

    project: str = "tiny-llm"
    entity: str | None = None
    """Team or user; null = the account's default."""
    mode: Literal["online", "offline", "disabled"] = "offline"
    """offline: files under <output_dir>/wandb, uploaded later with `wandb sync`."""


@dataclass(frozen=True, kw_only=True)
class TrackingConfig:
    """Live tracking of a run; not part of the recipe identity. Unset: nothing is imported."""

    tensorboard: bool = False
    """TensorBoard event files in <output_dir>/tensorboard."""
    wandb: WandbConfig | None = None
    name: str | None = None
    """Run name; null = the run directory's name (a campaign's run id)."""
    group: str | None = None
    """Run group; null = <parent directory>/<run name without its -sNN seed suffix>, so seeds sit together."""


@dataclass(frozen=True, kw_only=True)
class RecipeConfig:
    """A complete training recipe."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    decentralized: DecentralizedConfig | None = None
    """Packed decentralized training; null = one ordinary model."""
    tracking: TrackingConfig | None = None
    """TensorBoard / W&B; null = none (or $TINY_LLM_TRACKING, which the workflow sets)."""

    @property
    def data_seed(self) -> int:
        """The seed of the training data's order: training.data_seed, else runtime.seed."""
        seed = self.training.data_seed
        return self.runtime.seed if seed is None else seed


# Fields that never change what a run computes, so a resume may change them.
EXECUTION_ONLY_FIELDS = frozenset(
    {
        "training.checkpoint_policy",
        "training.checkpoint_every",
        "training.checkpoint_epochs",
        "runtime.output_dir",
        "runtime.device",
        "runtime.cpu_threads",
        "runtime.memory_limit_mb",
        "runtime.num_gpus",
        "data.cache_dir",
        "data.prefetch",
        "data.tokenize_batch_size",
        "data.prepare_workers",
        "tracking",
    }
)


# ----------------------------------------------------------------------------- loading


def preset_names() -> list[str]:
    """Names of the presets shipped with the package."""
    folder = resources.files("tiny_llm") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_config_source(source: str) -> dict[str, Any]:
    """Read one ``--config`` argument: a YAML path, or the name of a shipped preset."""
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists() or "/" in source:
        if not path.is_file():
            raise ConfigError(f"config file not found: {source}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            byte = exc.object[exc.start]
            raise ConfigError(
                f"{source}: not UTF-8 text (byte 0x{byte:02x} at offset {exc.start}); save it as UTF-8"
            ) from None
    else:
        preset = resources.files("tiny_llm") / "presets" / f"{source}.yaml"
        if not preset.is_file():
            raise ConfigError(
                f"unknown preset '{source}' (not a file either); presets: {', '.join(preset_names())}"
            )
        text = preset.read_text(encoding="utf-8")
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge recursively; scalars and lists replace."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_set(assignment: str) -> dict[str, Any]:
    """Turn ``a.b.c=value`` (value parsed as YAML) into a nested mapping."""
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set expects dotted.key=value, got '{assignment}'")
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except LongIntegerError:
        raise ConfigError(f"--set {key}: more digits than any setting takes; check the value") from None
    except yaml.YAMLError:
        value = raw
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    return nested


def load_recipe(
    configs: list[str] | None = None, sets: list[str] | None = None, overrides: dict[str, Any] | None = None
) -> RecipeConfig:
    """Defaults <- each --config in order <- ``overrides`` (nested) <- each --set in order, validated once."""
    merged: dict[str, Any] = {}
    for source in configs or []:
        merged = deep_merge(merged, read_config_source(source))
    merged = deep_merge(merged, overrides or {})
    for assignment in sets or []:
        merged = deep_merge(merged, parse_set(assignment))
    return recipe_from_dict(merged)


RETIRED_KEYS = {
    f"optimizer.muon_{key}": f"optimizer.muon.{key}"
    for key in ("lr", "momentum", "nesterov", "ns_steps", "weight_decay", "adjust_lr_fn")
}
"""Recipe keys that a section replaced, and their place now. Every recipe file written before holds them as
null (an AdamW run's): read as absent, so those files keep working; set, one is refused naming its place."""


def _retired_keys_dropped(data: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """``data`` without its null retired keys; a set one is a problem naming where it went."""
    out = dict(data)
    for key, place in RETIRED_KEYS.items():
        section, name = key.split(".")
        if not isinstance(out.get(section), dict) or name not in out[section]:
            continue
        if out[section][name] is not None:
            problems.append(f"{key}: is {place} now (a section of its own); move it there")
        out[section] = {k: v for k, v in out[section].items() if k != name}
    return out


def recipe_from_dict(data: dict[str, Any]) -> RecipeConfig:
    """Build and validate a recipe; raise ConfigError listing every problem."""
    problems: list[str] = []
    data = _retired_keys_dropped(data, problems)
    recipe = build(RecipeConfig, data, "", problems)
    if not problems:
        problems.extend(cross_field_problems(recipe))
    if problems:
        raise ConfigError("invalid recipe: " + "\n  ".join(problems))
    return recipe


# ----------------------------------------------------------------------------- checks


def cross_field_problems(recipe: RecipeConfig) -> list[str]:
    """Combinations that no run could satisfy."""
    m, t, o = recipe.model, recipe.training, recipe.optimizer
    problems = []
    if o.warmup_steps is not None and o.warmup_fraction != 0:
        problems.append(
            "optimizer.warmup_steps: exclusive with optimizer.warmup_fraction; set warmup_fraction to 0"
        )
    if t.checkpoint_epochs is not None:
        if t.checkpoint_policy not in ("interval", "all"):
            problems.append("training.checkpoint_epochs: needs training.checkpoint_policy interval or all")
        elif len(set(t.checkpoint_epochs)) < len(t.checkpoint_epochs):
            problems.append(f"training.checkpoint_epochs: need distinct epochs, got {t.checkpoint_epochs}")
    if m.width % m.num_heads:
        problems.append(f"model.width: {m.width} is not divisible by model.num_heads {m.num_heads}")
    elif (m.width // m.num_heads) % 2:
        problems.append(f"model.num_heads: head dim {m.width // m.num_heads} must be even for RoPE")
    if t.batch_tokens % m.context_length:
        problems.append(
            f"training.batch_tokens: {t.batch_tokens} is not a multiple of model.context_length "
            f"{m.context_length}"
        )
    elif t.micro_batch_size > t.batch_tokens // m.context_length:
        problems.append(
            f"training.micro_batch_size: {t.micro_batch_size} sequences exceed the "
            f"{t.batch_tokens // m.context_length} sequences of one update (training.batch_tokens)"
        )
    if recipe.data.shuffle_group_size is not None and t.data_passes > 1:
        problems.append(
            "data.shuffle_group_size: loader v2 reads every block once; set training.data_passes 1"
        )
    too_large = budget_problems(t, parameter_count(m))
    problems += too_large
    if too_large:
        return problems  # the checks below build the budget
    if t.epoch_tokens_per_parameter > t.tokens_per_parameter:
        problems.append("training.epoch_tokens_per_parameter: larger than training.tokens_per_parameter")
    elif t.data_passes > 1 and not problems:
        blocks = make_budget(recipe).num_blocks
        if t.data_passes > blocks:
            problems.append(f"training.data_passes: {t.data_passes} passes exceed the run's {blocks} blocks")
    device = recipe.runtime.device
    if device not in ("auto", "cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        problems.append(f"runtime.device: expected auto, cpu, cuda or cuda:N, got '{device}'")
    rt = recipe.runtime
    if rt.sdpa_backend != "auto" and (rt.attention_backend == "reference" or rt.deterministic):
        problems.append(
            f"runtime.sdpa_backend: '{rt.sdpa_backend}' has no effect with the reference attention "
            "(runtime.attention_backend reference or runtime.deterministic); leave it at auto"
        )
    elif rt.sdpa_backend in ("flash", "cudnn") and not rt.amp and rt.device != "cpu":
        # On the CPU the device check refuses them anyway (GPU-only kernels), with its own message.
        problems.append(
            f"runtime.sdpa_backend: '{rt.sdpa_backend}' takes only FP16/BF16 inputs, and runtime.amp is "
            "false (FP32 attention); set runtime.amp true, or use efficient or math (they take FP32)"
        )
    problems += _muon_problems(recipe)
    problems += _cuda_graph_problems(recipe)
    problems += _packed_problems(recipe)
    problems += _num_gpus_problems(recipe)
    return problems


def _num_gpus_problems(recipe: RecipeConfig) -> list[str]:
    """runtime.num_gpus splits the ordinary engine's microbatches evenly across ranks, and only that."""
    k, t = recipe.runtime.num_gpus, recipe.training
    if k == 1:
        return []
    if recipe.decentralized is not None or recipe.runtime.cuda_graph:
        what = "packed training (decentralized)" if recipe.decentralized is not None else "runtime.cuda_graph"
        return [f"runtime.num_gpus: {k} ranks are not for {what}; set runtime.num_gpus 1"]
    micro = -(-(t.batch_tokens // recipe.model.context_length) // t.micro_batch_size)
    if micro % k:
        return [
            f"runtime.num_gpus: the {micro} microbatches of an update (training.batch_tokens / "
            f"micro_batch_size) do not divide among {k} ranks; change training.micro_batch_size or num_gpus"
        ]
    return []


def _muon_problems(recipe: RecipeConfig) -> list[str]:
    """The muon section applies only under optimizer.name muon; Muon has no captured update."""
    o = recipe.optimizer
    if o.name != "muon":
        if o.muon is not None:
            return [f"optimizer.muon: applies only under optimizer.name muon (it is {o.name}); remove it"]
        return []
    if recipe.runtime.cuda_graph:
        return ["runtime.cuda_graph: captures the fused AdamW update only; set it false under muon"]
    return []


def _cuda_graph_problems(recipe: RecipeConfig) -> list[str]:
    """runtime.cuda_graph captures the ordinary engine's sync-free fused update, and only that."""
    rt = recipe.runtime
    if not rt.cuda_graph:
        return []
    if rt.device == "cpu":
        return ["runtime.cuda_graph: needs a CUDA device (runtime.device is cpu); set it false"]
    if rt.deterministic or not rt.fused_optimizer:
        return [
            "runtime.cuda_graph: needs the fused optimizer's device-side finite check; set "
            "runtime.fused_optimizer true and runtime.deterministic false"
        ]
    if rt.compile and rt.compile_mode != "default":
        return [
            f"runtime.cuda_graph: compile_mode {rt.compile_mode} makes CUDA graphs of its own, which cannot "
            "be captured inside the update's; use runtime.compile_mode default"
        ]
    if recipe.decentralized is not None:
        return ["runtime.cuda_graph: not for packed training (decentralized); set it false"]
    return []


def _packed_problems(recipe: RecipeConfig) -> list[str]:
    dec = recipe.decentralized
    if dec is None:
        return []
    problems = []
    need = dec.num_models * recipe.training.micro_batch_size * recipe.model.context_length
    if recipe.training.batch_tokens != need:
        problems.append(
            f"training.batch_tokens: packed training needs num_models x micro_batch_size x context_length "
            f"= {need}, got {recipe.training.batch_tokens}"
        )
    if dec.topology == "one_peer_ring" and dec.num_models % 2:
        problems.append(
            f"decentralized.topology: one_peer_ring needs an even num_models, got {dec.num_models}"
        )
    if not problems:
        problems += packed_epoch_problems(recipe)
    return problems


# ----------------------------------------------------------------------------- dumping


def recipe_to_dict(recipe: RecipeConfig) -> dict[str, Any]:
    """Plain nested dict of every field (what resolved.yaml holds); an unset ``tracking`` is left out, so
    recipe files, and the workflow jobs that read them, stay as they were before tracking existed."""
    data = dataclasses.asdict(recipe)
    if data["tracking"] is None:
        del data["tracking"]
    return data


def dump_recipe(recipe: RecipeConfig) -> str:
    return yaml.safe_dump(recipe_to_dict(recipe), sort_keys=False)


def _identity_view(obj: Any, cls: type | None, prefix: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        return obj
    out = {}
    for f in dataclasses.fields(obj):
        key = f"{prefix}{f.name}"
        if key in EXECUTION_ONLY_FIELDS:
            continue
        value = getattr(obj, f.name)
        if f.metadata.get("late") and value == f.default:
            continue  # fields added later vanish at their default so older identities stay valid
        out[f.name] = _identity_view(value, None, f"{key}.")
    return out


def recipe_identity_payload(recipe: RecipeConfig) -> dict[str, Any]:
    """The identity-relevant part of the recipe (no execution-only fields)."""
    payload = _identity_view(recipe, None, "")
    if recipe.optimizer.lr_schedule == "wsd":  # its default changed (0.2 -> 0.1): never implied by absence
        payload["optimizer"]["decay_fraction"] = recipe.optimizer.decay_fraction
    return payload


def recipe_identity(recipe: RecipeConfig, cache_identity: str | None) -> str:
    """sha256 of the canonical identity payload plus the token cache identity."""
    payload = {"recipe": recipe_identity_payload(recipe), "cache_identity": cache_identity}
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def identity_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two identity payloads."""
    keys = sorted(set(old) | set(new))
    diffs = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += identity_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs
