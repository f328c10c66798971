"""Pure, torch-free arithmetic: parameter counts, token budgets, epochs, updates, LR.

Everything here is a small function of the recipe, so it is shared by the
trainer, `describe`, the tuner and the campaign's GPU-hour estimate, and is
unit-tested at its edges. It only reads the recipe's fields, so the config
module, whose validation asks for the packed-epoch check below, can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiny_llm.errors import ConfigError

if TYPE_CHECKING:  # annotations only: config imports this module
    from tiny_llm.config import ModelConfig, OptimizerConfig, RecipeConfig, TrainingConfig

MAX_TRAIN_TOKENS = 10**15
"""More training tokens than any run here can use (a uint16 cache of them is 2 PB): a typo, refused."""
MAX_EPOCHS = 100_000
"""More epochs than any recipe means (each is a validation pass): a typo, refused before allocating them."""
MAX_UPDATES = 10**7
"""More updates than any run here makes (the 20m reference makes 3,120; more than a day at 100 per second): a
typo, refused before the schedule of every update (about 140 bytes each, with its learning rate) is built."""


def parameter_count(model: ModelConfig) -> int:
    """Unique parameters, tied embedding counted once: V·d + L·(4d² + 3·d·f + 2d) + d."""
    d, f = model.width, model.ffn_width
    return model.vocab_size * d + model.num_layers * (4 * d * d + 3 * d * f + 2 * d) + d


def non_embedding_parameter_count(model: ModelConfig) -> int:
    return parameter_count(model) - model.vocab_size * model.width


def flops_per_token(model: ModelConfig) -> float:
    """Training FLOPs per target token (forward + backward), the numerator of MFU:

        6 * N_matmul + 6 * num_layers * width * context_length

    N_matmul: the weights of every matmul (q/k/v/out, gate/up/down and the tied embedding counted once, as
    the LM head), i.e. all parameters but the RMSNorm scales. A weight costs 2 FLOPs per token forward and
    4 backward. Causal attention: a token at position t does QK^T and attention x V over t keys, 2 * width * t
    FLOPs each forward; averaged over the context, t ~ context_length / 2, so 2 * width * context_length
    forward per layer, times 3 with the backward (non-causal counting would double this term). Softmax,
    norms, RoPE, SwiGLU's elementwise work and the optimizer are not counted. 20m: 122,388,480 + 15,728,640
    = 138,117,120 FLOPs per token.
    """
    n_matmul = parameter_count(model) - model.width * (2 * model.num_layers + 1)  # drop norm scales
    attention = 6 * model.num_layers * model.width * model.context_length  # causal QK^T and AV, fwd+bwd
    return 6.0 * n_matmul + attention


@dataclass(frozen=True)
class Budget:
    """The realized token budget of one model's training run."""

    parameters: int
    target_tokens: int
    """tokens_per_parameter x parameters, before rounding up to whole blocks."""
    context_length: int
    blocks_per_update: int
    epoch_boundaries: tuple[int, ...]
    """Cumulative block index at the end of each epoch; the last is the total."""
    data_passes: int = 1
    """Passes over the unique blocks (training.data_passes)."""
    group_tokens: int | None = None
    """Loader v2: tokens of one shuffle group (data.shuffle_group_size x data.shard_tokens); None = v1."""

    @property
    def num_blocks(self) -> int:
        return self.epoch_boundaries[-1]

    @property
    def tokens(self) -> int:
        """Realized training targets: whole blocks."""
        return self.num_blocks * self.context_length

    @property
    def num_epochs(self) -> int:
        return len(self.epoch_boundaries)

    @property
    def unique_blocks(self) -> int:
        """Distinct train blocks the run reads: all of them, or ceil(blocks / data_passes) when it repeats."""
        return -(-self.num_blocks // self.data_passes)

    @property
    def read_blocks(self) -> int:
        """Blocks at the start of the cache that the run's samples come from (loader v2: every block of the
        groups it touches, though it trains on num_blocks of them)."""
        if self.group_tokens is not None:
            return (self.cache_tokens_needed - 1) // self.context_length
        return self.unique_blocks

    @property
    def cache_tokens_needed(self) -> int:
        """Train tokens the cache must hold: every unique target plus the first input token (loader v2:
        every block of the groups the run touches, see `loader_v2_tokens_needed`)."""
        if self.group_tokens is not None:
            return loader_v2_tokens_needed(self.num_blocks, self.context_length, self.group_tokens)
        return self.unique_blocks * self.context_length + 1

    def epoch_updates(self, epoch: int) -> list[int]:
        """Block counts of the updates of ``epoch`` (0-based); the last may be short."""
        start = self.epoch_boundaries[epoch - 1] if epoch else 0
        blocks = self.epoch_boundaries[epoch] - start
        full, rest = divmod(blocks, self.blocks_per_update)
        return [self.blocks_per_update] * full + ([rest] if rest else [])

    @property
    def num_updates(self) -> int:
        return sum(len(self.epoch_updates(e)) for e in range(self.num_epochs))

    def update_schedule(self) -> list[tuple[int, int, int]]:
        """(epoch, start_block, num_blocks) for every update, in order."""
        out = []
        start = 0
        for epoch in range(self.num_epochs):
            for blocks in self.epoch_updates(epoch):
                out.append((epoch, start, blocks))
                start += blocks
        return out


def loader_v2_tokens_needed(num_blocks: int, context_length: int, group_tokens: int) -> int:
    """Train tokens a v2 run of ``num_blocks`` needs: every block of the groups it touches, the last
    block's final target, and one token of the next shard (which marks the group complete)."""
    L = context_length
    end = ((num_blocks - 1) * L // group_tokens + 1) * group_tokens  # smallest group end past the last block
    return max(-(-end // L) * L + 1, end + 1)


def budget_problems(training: TrainingConfig, params: int) -> list[str]:
    """The budget's counts bounded before anything is allocated for them (one line each, naming the key)."""
    total, ratio = training.tokens_per_parameter * params, training.tokens_per_parameter
    if not total <= MAX_TRAIN_TOKENS:
        return [
            f"training.tokens_per_parameter: {ratio:g} gives {total:.3g} training tokens, more than "
            f"{MAX_TRAIN_TOKENS:.0e}; lower it"
        ]
    batch = training.batch_tokens
    if batch > 0 and not total / batch <= MAX_UPDATES:  # at least this many: whole blocks, short epoch ends
        return [
            f"training.tokens_per_parameter: {ratio:g} gives {total / batch:.3g} updates of "
            f"training.batch_tokens {batch}, more than {MAX_UPDATES:,}; lower it or raise "
            "training.batch_tokens"
        ]
    epoch = training.epoch_tokens_per_parameter
    if epoch > 0 and not ratio / epoch <= MAX_EPOCHS:
        return [
            f"training.epoch_tokens_per_parameter: {epoch:g} gives {ratio / epoch:.3g} epochs of "
            f"training.tokens_per_parameter {ratio:g}, more than {MAX_EPOCHS:,}; use longer epochs"
        ]
    return []


def make_budget(recipe: RecipeConfig, parameters: int | None = None) -> Budget:
    """Budget of ``recipe``; packed runs count one model's parameters and keep epochs multiples of N.
    ConfigError (naming the key) for counts too large to allocate."""
    model, training = recipe.model, recipe.training
    params = parameters if parameters is not None else parameter_count(model)
    problems = budget_problems(training, params)
    if problems:
        raise ConfigError(problems[0])
    L = model.context_length
    total = math.ceil(training.tokens_per_parameter * params)
    epoch = training.epoch_tokens_per_parameter * params
    num_epochs = max(1, math.ceil(total / epoch - 1e-9))
    raw = [math.ceil(min(total, i * epoch) / L) for i in range(1, num_epochs + 1)]
    # Rounding total up to whole tokens can leave a last "epoch" that adds no block: drop it.
    boundaries = tuple(b for i, b in enumerate(raw) if i == 0 or b > raw[i - 1])
    if recipe.decentralized is not None:  # every worker gets the same number of blocks in each epoch
        n = recipe.decentralized.num_models
        boundaries = tuple(-(-b // n) * n for b in boundaries)
    return Budget(
        parameters=params,
        target_tokens=total,
        context_length=L,
        blocks_per_update=training.batch_tokens // L,
        epoch_boundaries=boundaries,
        data_passes=training.data_passes,
        group_tokens=recipe.data.shuffle_group_size
        and recipe.data.shuffle_group_size * recipe.data.shard_tokens,
    )


def kept_epochs(recipe: RecipeConfig) -> list[int]:
    """1-based epochs whose epoch-NNN files a run writes: training.checkpoint_epochs (those within the run),
    else every epoch under policy all, else none."""
    num_epochs = make_budget(recipe).num_epochs
    chosen = recipe.training.checkpoint_epochs
    if chosen is not None and recipe.training.checkpoint_policy in ("interval", "all"):
        return sorted(e for e in chosen if e <= num_epochs)
    return list(range(1, num_epochs + 1)) if recipe.training.checkpoint_policy == "all" else []


def packed_epoch_problems(recipe: RecipeConfig) -> list[str]:
    """Every epoch boundary must be a multiple of N blocks, and no epoch may be empty (recipe validation)."""
    if recipe.decentralized is None:
        return []
    n = recipe.decentralized.num_models
    bounds = make_budget(recipe).epoch_boundaries
    if all(b % n == 0 for b in bounds) and len(set(bounds)) == len(bounds) and bounds[0] > 0:
        return []
    return [
        f"training.epoch_tokens_per_parameter: packed epochs must each hold a positive multiple of "
        f"decentralized.num_models={n} blocks (boundaries {list(bounds[:3])}...); use longer epochs"
    ]


def warmup_tokens(total_tokens: float, opt: OptimizerConfig, batch_tokens: int | None) -> float:
    """Targets of the linear warm-up: warmup_steps full updates, else warmup_fraction of the total."""
    if opt.warmup_steps is None:
        return opt.warmup_fraction * total_tokens
    if batch_tokens is None:
        raise ValueError("the warm-up needs batch_tokens when optimizer.warmup_steps is set")
    return float(opt.warmup_steps * batch_tokens)


def lr_at(tokens: float, total_tokens: float, opt: OptimizerConfig, batch_tokens: int | None = None) -> float:
    """Learning rate after ``tokens`` targets (evaluate at an update's end token).

    Linear warmup over warmup_fraction of the tokens (or warmup_steps x ``batch_tokens``, the first
    warmup_steps full updates, whatever the total), then either cosine down to
    min_lr_ratio x peak, or (wsd, as the reference) the peak held until the last
    decay_fraction of the tokens and peak x (1 - sqrt(q)) down to 0 over it, q
    the progress through that decay (0 -> 1). min_lr_ratio is cosine's only.
    """
    peak = opt.lr
    warmup = warmup_tokens(total_tokens, opt, batch_tokens)
    if tokens < warmup:
        return peak * tokens / warmup
    if opt.lr_schedule == "wsd":
        decay_start = max(warmup, total_tokens * (1.0 - opt.decay_fraction))
        if tokens <= decay_start or decay_start >= total_tokens:
            return peak
        q = min(1.0, (tokens - decay_start) / (total_tokens - decay_start))
        return peak * (1.0 - math.sqrt(q))
    floor = peak * opt.min_lr_ratio
    q = min(1.0, (tokens - warmup) / max(total_tokens - warmup, 1e-12))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * q))


def step_lrs(recipe: RecipeConfig) -> list[float]:
    """The LR of every update, evaluated at the update's end token (as the trainer does)."""
    budget = make_budget(recipe)
    batch, length = recipe.training.batch_tokens, budget.context_length
    return [
        lr_at((start + n) * length, budget.tokens, recipe.optimizer, batch)
        for _, start, n in budget.update_schedule()
    ]


def stable_updates(recipe: RecipeConfig) -> int:
    """Updates before a WSD run's decay: those ending at or before its decay start, which every longer
    horizon with the same warm-up in steps trains identically. The whole run for cosine."""
    budget, opt = make_budget(recipe), recipe.optimizer
    if opt.lr_schedule != "wsd":
        return budget.num_updates
    warmup = warmup_tokens(budget.tokens, opt, recipe.training.batch_tokens)
    decay_start = max(warmup, budget.tokens * (1.0 - opt.decay_fraction))
    L = budget.context_length
    return sum(1 for _, start, n in budget.update_schedule() if (start + n) * L <= decay_start)


def describe(recipe: RecipeConfig) -> dict[str, int | float]:
    """What a user needs to plan a run (the `describe` subcommand)."""
    budget = make_budget(recipe)
    return {
        "parameters": budget.parameters,
        "non_embedding_parameters": non_embedding_parameter_count(recipe.model),
        "num_models": recipe.decentralized.num_models if recipe.decentralized else 1,
        "target_tokens": budget.target_tokens,
        "tokens": budget.tokens,
        "blocks": budget.num_blocks,
        "epochs": budget.num_epochs,
        "updates": budget.num_updates,
        "batch_tokens": recipe.training.batch_tokens,
        "data_passes": budget.data_passes,
        "cache_tokens_needed": budget.cache_tokens_needed,
        "flops_per_token": flops_per_token(recipe.model),
    }
