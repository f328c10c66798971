"""Validation loss: per-target FP32 cross entropy accumulated in FP64, so batch size changes only rounding.

With runtime.compile (and not deterministic) on a CUDA device a batch runs through one compiled function: the
model's hidden states, then the loss chunk by chunk (``tiny_llm.model.chunked_token_losses``), so the FP32
logits copy and log-softmax of the eager path are never written. A short last batch is padded with ignored
targets to the batch size and every batch is contiguous, so the subset and the full validation share one
compiled shape: the compile is paid once per process. Otherwise (the CPU, where compiling never pays at the
sizes it runs; ``COMPILED_DEVICE_TYPES``) the eager ``token_losses`` runs, as it always did.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tiny_llm.config import RecipeConfig
from tiny_llm.data.cache import TokenCache
from tiny_llm.model import IGNORE_INDEX, Llama, chunked_token_losses, token_losses
from tiny_llm.runtime.device import (
    compute_context,
    forced_sdpa_kernel,
    pin_for,
    setup_runtime,
    synchronize,
    to_device,
    uses_compile,
    with_forced_kernel,
)
from tiny_llm.runtime.engine import EngineFactory, build_model
from tiny_llm.terminal import counted
from tiny_llm.train import distributed


class EvaluationAborted(Exception):
    """A stop was requested during evaluation."""


LN2 = math.log(2.0)


@dataclass(frozen=True)
class EvalSums:
    """What one pass over the batches adds up (over every rank)."""

    loss: float
    """Mean nats per valid target (NaN for none)."""
    tokens: int
    """Valid targets."""
    bpb: float | None = None
    """Bits per byte: the nats of the targets that are text over ln 2 times their UTF-8 bytes (SPEC §12);
    None without a byte table or bytes."""
    bytes: int | None = None
    """UTF-8 bytes of the valid targets (special ids count 0); None without a byte table."""


@dataclass
class EvalResult:
    loss: float
    tokens: int
    """Valid targets evaluated."""
    seconds: float
    split: str
    """'subset' or 'full'."""
    validation_complete: bool
    bpb: float | None = None
    """Bits per byte of the same targets (``EvalSums.bpb``)."""
    bytes: int | None = None
    """UTF-8 bytes of the evaluated targets (EOS and other special ids: 0)."""

    @property
    def tokens_per_second(self) -> float | None:
        """Valid targets evaluated per second of the whole pass (data copies included)."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def perplexity(self) -> float | None:
        """exp(loss); None (JSON null) where it overflows a float (loss > ~709 nats, a diverging run)."""
        return math.exp(self.loss) if self.loss < 700 else None

    def as_dict(self) -> dict[str, float | int | str | bool | None]:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "split": self.split,
            "validation_complete": self.validation_complete,
            "bpb": self.bpb,
            "bytes": self.bytes,
        }


def subset_batches(
    blocks: torch.Tensor, batch_size: int, device: torch.device | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The validation subset's [n, L+1] blocks as contiguous (inputs, targets) batches, in pinned memory when
    bound for a CUDA ``device``: made once, a caller that keeps them pins them once.

    Not views of the blocks: a CUDA copy of a non-contiguous tensor goes through a contiguous copy in pageable
    memory, pinned or not, and blocks the host; and a compiled evaluation would see other strides than the
    full validation's batches, and compile again."""
    batches = []
    for chunk in blocks.split(batch_size):
        inputs, targets = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
        if device is not None:
            inputs, targets = pin_for(inputs, device), pin_for(targets, device)
        batches.append((inputs, targets))
    return batches


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# Logits per loss chunk: a few MiB keeps a CPU chunk in cache; larger GPU chunks keep the matmuls efficient.
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 28}
# Evaluation never uses CUDA graphs: a large batch gains little from them, and graph trees replayed between
# the training's own would have to be kept apart from them.
EVAL_COMPILE_MODES = {"default": None, "reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}
# Where runtime.compile compiles the evaluation. Not the CPU: there a run's compiles cost more than they save.
# A demo-s train (0.2 tokens per parameter, one thread; benchmarks/README.md) spent 12.7 s (cold compile
# cache) and 1.3 s (warm) on its compiled final validation against 0.7-1.1 s eager, and 14.5 s / 0.56 s on
# its first subset validation against 0.15 s: the compiled loss is faster per token (eval_speed.py), but a
# CPU run evaluates too few tokens to earn even a warm cache's tracing and loading back.
COMPILED_DEVICE_TYPES: frozenset[str] = frozenset({"cuda"})
# (compile mode, forced SDPA kernel) -> the compiled loss. One per process, for every model: the model is an
# argument, so nothing here keeps a model (or its weights) alive.
_COMPILED: dict[tuple[str | None, str | None], Callable[..., torch.Tensor]] = {}


def compiled_losses(model: nn.Module, recipe: RecipeConfig, device: torch.device) -> LossFn | None:
    """The compiled per-target loss of ``model``, or None where evaluation is eager (no runtime.compile, the
    deterministic or reference path, a device not in ``COMPILED_DEVICE_TYPES``, a model that is no Llama)."""
    if not (uses_compile(recipe) and device.type in COMPILED_DEVICE_TYPES and isinstance(model, Llama)):
        return None
    mode = EVAL_COMPILE_MODES[recipe.runtime.compile_mode]
    key = (mode, forced_sdpa_kernel(recipe))
    if key not in _COMPILED:
        # dynamic=False: padded, contiguous batches keep one shape; a shape that did change would get a static
        # graph of its own rather than turn this one dynamic.
        _COMPILED[key] = torch.compile(
            with_forced_kernel(chunked_token_losses, recipe), mode=mode, dynamic=False
        )
    rows = max(1, CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"]) // model.cfg.vocab_size)
    return functools.partial(_COMPILED[key], model, rows=rows)


def pad_batch(inputs: torch.Tensor, targets: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A short batch padded to ``rows`` rows with ignored targets (they add exactly 0 to the sum)."""
    missing = rows - inputs.shape[0]
    if missing <= 0:
        return inputs, targets
    pad = inputs.new_zeros(missing, inputs.shape[1])
    return torch.cat([inputs, pad]), torch.cat([targets, pad.fill_(IGNORE_INDEX)])


def evaluate_batches(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    recipe: RecipeConfig,
    device: torch.device,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[float, int]:
    """(mean loss, valid targets) over (inputs, targets) host batches; targets -100 are ignored."""
    sums = evaluate_sums(model, batches, recipe, device, should_stop)
    return sums.loss, sums.tokens


@torch.no_grad()
def evaluate_sums(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    recipe: RecipeConfig,
    device: torch.device,
    should_stop: Callable[[], bool] | None = None,
    token_bytes: torch.Tensor | None = None,
) -> EvalSums:
    """Loss, targets and (given ``token_bytes``, the UTF-8 bytes of each id) bits per byte over (inputs,
    targets) host batches; targets -100 are ignored.

    Targets and their bytes are counted on the host before the copy, and the nats of the targets that are
    text are summed on the device beside the loss (the byte table gathered there), so the loop never waits
    for the device: the only synchronisation is reading the FP64 totals at the end.
    """
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    text_total = torch.zeros((), dtype=torch.float64, device=device)
    count, num_bytes = 0, 0
    on_device = None if token_bytes is None else token_bytes.to(device)
    compiled = compiled_losses(model, recipe, device)
    loss_fn = compiled or functools.partial(token_losses, model)
    try:
        for inputs, targets in distributed.shard(batches):  # this rank's batches (all of them on one)
            if should_stop is not None and should_stop():
                raise EvaluationAborted()
            valid = targets != IGNORE_INDEX
            count += int(valid.sum())
            if token_bytes is not None:
                num_bytes += int(token_bytes[targets[valid]].sum())
            if compiled is not None:
                inputs, targets = pad_batch(inputs, targets, recipe.evaluation.batch_size)
            device_targets = to_device(targets, device)
            with compute_context(recipe, device):
                losses = loss_fn(to_device(inputs, device), device_targets)
            total += losses.double().sum()
            if on_device is not None:  # ignored targets have 0 loss: any id stands in for them
                text = on_device[device_targets.flatten().clamp_min(0)] > 0
                text_total += torch.where(text, losses.double(), 0.0).sum()
    finally:
        model.train(was_training)
    totals, counts = distributed.sum_over_ranks((total, text_total), (count, num_bytes))
    return sums_of(totals, counts, token_bytes is not None)


def sums_of(totals: tuple[torch.Tensor, ...], counts: tuple[int, ...], with_bytes: bool) -> EvalSums:
    """The pass's means from its (loss, text nats) totals and (targets, bytes) counts."""
    (total, text_total), (count, num_bytes) = totals, counts
    if count == 0:
        return EvalSums(math.nan, 0, None, num_bytes if with_bytes else None)
    loss = total.item() / count
    if not with_bytes:
        return EvalSums(loss, count)
    bpb = text_total.item() / (LN2 * num_bytes) if num_bytes else None
    return EvalSums(loss, count, bpb, num_bytes)


def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    recipe: RecipeConfig,
    device: torch.device,
    *,
    split: str,
    validation_complete: bool,
    should_stop: Callable[[], bool] | None = None,
    token_bytes: torch.Tensor | None = None,
) -> EvalResult:
    start = time.perf_counter()
    sums = evaluate_sums(model, batches, recipe, device, should_stop, token_bytes)
    synchronize(device)
    seconds = time.perf_counter() - start
    return EvalResult(sums.loss, sums.tokens, seconds, split, validation_complete, sums.bpb, sums.bytes)


def byte_table(cache: TokenCache) -> torch.Tensor | None:
    """The cache's bytes per token id (``TokenCache.token_bytes``) as a host tensor, or None."""
    sizes = cache.token_bytes()
    return None if sizes is None else torch.from_numpy(sizes)


def load_weights(model: Llama, path: Path) -> None:
    """Load a model's weights from .safetensors into ``model`` (strict)."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path), device="cpu"))


def evaluate_checkpoint(
    recipe: RecipeConfig, path: Path, build_engine: EngineFactory, *, full: bool
) -> dict[str, object]:
    """Validation loss of a .safetensors weights file or a .pt training state (packed: averaged model).

    A training state is read into the engine ``build_engine`` makes for the recipe
    (``tiny_llm.engines.evaluate_checkpoint`` passes the one the recipe needs).
    """
    from tiny_llm.data.cache import open_cache
    from tiny_llm.data.loader import iter_validation, validation_num_targets, validation_subset
    from tiny_llm.errors import DataError
    from tiny_llm.train.checkpoint import load_state

    if not path.is_file():
        raise DataError(f"checkpoint not found: {path}")
    device = setup_runtime(recipe)
    cache = open_cache(recipe.data.cache_dir, verify=True)
    cache.check_compatible(recipe)
    if path.suffix == ".safetensors":
        llama = build_model(recipe, device)
        try:
            load_weights(llama, path)
        except Exception as exc:
            raise DataError(
                f"{path}: weights do not fit the recipe's model ({str(exc).splitlines()[0]})"
            ) from None
        model: nn.Module = llama
    elif path.suffix == ".pt":
        engine = build_engine(recipe, device)
        engine.load_state_dict(load_state(path)["engine"])
        model = engine.eval_model()
    else:
        raise DataError(f"{path}: expected a .safetensors weights file or a .pt training state")
    L, batch = recipe.model.context_length, recipe.evaluation.batch_size
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
    if full:
        num_batches = math.ceil(math.ceil(validation_num_targets(cache) / L) / batch)
        batches = counted(
            iter_validation(cache, L, batch), total=num_batches, desc="validation", unit="batch"
        )
    else:
        subset = validation_subset(cache, L, recipe.evaluation.subset_blocks, recipe.evaluation.seed)
        batches = subset_batches(subset, batch, device)
    split = "full" if full else "subset"
    result = evaluate(
        model,
        batches,
        recipe,
        device,
        split=split,
        validation_complete=cache.validation_complete,
        token_bytes=byte_table(cache),
    )
    return {**result.as_dict(), "checkpoint": str(path)}
