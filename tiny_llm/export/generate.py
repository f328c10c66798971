"""Text generation with a KV cache: greedy at temperature 0, else temperature / top-k / top-p sampling.

The prompt runs once through ``Llama.decode`` (prefill); every new token then runs alone against the
cache. Draws come from a seeded generator on the host, so a seed gives the same continuation on every run
(and on CPU and GPU alike, as far as their logits agree). Batch 1.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from tiny_llm.config import RecipeConfig
from tiny_llm.export.settings import SamplingConfig
from tiny_llm.model import KVCache, Llama

StopReason = Literal["eos", "length", "context"]


@dataclass
class Generation:
    """New tokens of one prompt and how long they took."""

    tokens: list[int]
    """New token ids (the EOS that stopped generation included)."""
    stop_reason: StopReason
    """eos, length (max_new_tokens reached) or context (model.context_length reached first)."""
    prompt_tokens: int
    """Prompt length fed to the model (document-start EOS included)."""
    prefill_seconds: float
    """Time to the first new token (the prompt's forward pass and the first choice)."""
    decode_seconds: float
    """Time of the remaining tokens."""

    @property
    def tokens_per_second(self) -> float | None:
        """Rate of the tokens after the first (the decode rate), None when there were none."""
        rest = len(self.tokens) - 1
        return rest / self.decode_seconds if rest > 0 and self.decode_seconds > 0 else None


def sampling_distribution(
    logits: torch.Tensor, settings: SamplingConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, token ids) the next token is drawn from, given one position's logits [V].

    transformers' warpers in their order: temperature, top-k, then top-p, which keeps the most likely
    tokens whose more likely predecessors hold less than top_p of the mass (always the first). Only the
    kept tokens are returned, most likely first; the probabilities are on the host.
    """
    scores = logits.float() / settings.temperature
    if settings.top_k is not None and settings.top_k < scores.numel():
        values, order = torch.topk(scores, settings.top_k)  # sorted, most likely first
    else:
        values, order = torch.sort(scores, descending=True)
    if settings.top_p < 1.0:
        probs = values.softmax(-1)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        kept = int((before < settings.top_p).sum())
        values, order = values[: max(kept, 1)], order[: max(kept, 1)]
    return values.softmax(-1).cpu(), order.cpu()


def choose_token(logits: torch.Tensor, settings: SamplingConfig, generator: torch.Generator) -> int:
    """Next token from one position's logits [V]: argmax at temperature 0, else a seeded draw from
    ``sampling_distribution``."""
    if settings.temperature == 0:
        return int(logits.argmax())
    probs, ids = sampling_distribution(logits, settings)
    return int(ids[int(torch.multinomial(probs, 1, generator=generator))])


@torch.inference_mode()
def generate(
    model: Llama,
    prompt: list[int],
    settings: SamplingConfig,
    *,
    eos_token_id: int,
    use_cache: bool = True,
    cache_dtype: torch.dtype | None = None,
) -> Generation:
    """Continue ``prompt`` (token ids, document-start EOS already added if wanted).

    ``use_cache=False`` recomputes the whole sequence for every token (the reference the cache is tested
    against); ``cache_dtype`` is the keys' and values' dtype (default: the weights'; under autocast, its
    dtype). Stops at EOS (if settings.stop_at_eos), after max_new_tokens, or when the context is full.
    """
    context = model.cfg.context_length
    if not prompt:
        raise ValueError("the prompt has no tokens")
    if len(prompt) > context:
        raise ValueError(f"the prompt has {len(prompt)} tokens; model.context_length is {context}")
    device = model.embed.weight.device
    generator = torch.Generator().manual_seed(settings.seed)
    room = context - len(prompt)
    budget = min(settings.max_new_tokens, room)
    start = time.perf_counter()
    sequence = torch.tensor([prompt], dtype=torch.long, device=device)
    dtype = cache_dtype or model.embed.weight.dtype
    cache = KVCache(model.cfg, 1, device, dtype) if use_cache else None
    logits = model.decode(sequence, cache) if cache is not None else model(sequence)
    tokens: list[int] = []
    reason: StopReason = "length" if budget == settings.max_new_tokens else "context"
    first_done = start
    while len(tokens) < budget:
        token = choose_token(logits[0, -1], settings, generator)
        tokens.append(token)
        if len(tokens) == 1:
            first_done = time.perf_counter()
        if settings.stop_at_eos and token == eos_token_id:
            reason = "eos"
            break
        if len(tokens) == budget:
            break
        step = torch.tensor([[token]], dtype=torch.long, device=device)
        if cache is not None:
            logits = model.decode(step, cache)
        else:
            sequence = torch.cat([sequence, step], dim=1)
            logits = model(sequence)
    end = time.perf_counter()
    if not tokens:
        first_done = end
    return Generation(tokens, reason, len(prompt), first_done - start, end - first_done)


def prompt_ids(text_ids: list[int], settings: SamplingConfig, eos_token_id: int) -> list[int]:
    """The ids fed to the model: EOS first when settings.document_start (or when the text is empty)."""
    if settings.document_start or not text_ids:
        return [eos_token_id, *text_ids]
    return list(text_ids)


def continue_text(
    recipe: RecipeConfig,
    checkpoint: Path,
    prompt: str,
    settings: SamplingConfig,
    *,
    device: str = "auto",
    worker: int | None = None,
) -> dict[str, Any]:
    """Continue ``prompt`` with a checkpoint on ``device`` (the recipe's cache gives the tokenizer); what
    `generate --json` prints: the prompt, its completion, token counts, timings, device and settings."""
    from tiny_llm.data.cache import open_cache
    from tiny_llm.data.tokenizer import load_tokenizer
    from tiny_llm.errors import ConfigError
    from tiny_llm.export.weights import load_model
    from tiny_llm.runtime.device import autocast_dtype, compute_context, setup_runtime

    recipe = dataclasses.replace(recipe, runtime=dataclasses.replace(recipe.runtime, device=device))
    torch_device = setup_runtime(recipe)
    cache = open_cache(recipe.data.cache_dir, verify=False)
    cache.check_compatible(recipe)
    tokenizer = load_tokenizer(str(cache.path / "tokenizer"))
    model = load_model(recipe, checkpoint, torch_device, worker=worker)
    ids = prompt_ids(tokenizer.encode_batch([prompt])[0], settings, cache.eos_token_id)
    context = recipe.model.context_length
    if len(ids) >= context:
        raise ConfigError(f"the prompt has {len(ids)} tokens; model.context_length {context} leaves no room")
    with compute_context(recipe, torch_device):
        out = generate(
            model,
            ids,
            settings,
            eos_token_id=cache.eos_token_id,
            cache_dtype=autocast_dtype(recipe, torch_device),
        )
    new = out.tokens[:-1] if out.stop_reason == "eos" else out.tokens
    return {
        "prompt": prompt,
        "completion": tokenizer.decode(new),
        "prompt_tokens": out.prompt_tokens,
        "new_tokens": len(out.tokens),
        "token_ids": out.tokens,
        "stop_reason": out.stop_reason,
        "seconds": out.prefill_seconds + out.decode_seconds,
        "first_token_seconds": out.prefill_seconds,
        "decode_tokens_per_second": out.tokens_per_second,
        "device": str(torch_device),
        "checkpoint": str(checkpoint),
        "worker": worker,
        "settings": settings.as_dict(),
    }
