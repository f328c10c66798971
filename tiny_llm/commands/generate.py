"""`generate`: continue a prompt with a checkpoint (KV cache; greedy at --temperature 0)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from tiny_llm.commands.export import add_source_arguments, resolve_source
from tiny_llm.export.settings import SamplingConfig

DEFAULTS = SamplingConfig()


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--prompt", required=True, help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    parser.add_argument(
        "--temperature", type=float, default=DEFAULTS.temperature, help="0 = greedy (default %(default)s)"
    )
    parser.add_argument("--top-k", type=int, default=DEFAULTS.top_k, help="0 = off (default %(default)s)")
    parser.add_argument("--top-p", type=float, default=DEFAULTS.top_p, help="1 = off (default %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed)
    parser.add_argument(
        "--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default %(default)s)"
    )
    parser.add_argument(
        "--no-document-start",
        action="store_true",
        help="do not put EOS before the prompt (training documents start after an EOS)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text")


def run(args: argparse.Namespace) -> int:
    settings = SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k or None,
        top_p=args.top_p,
        seed=args.seed,
        document_start=not args.no_document_start,
    ).check("generate")
    recipe, checkpoint = resolve_source(args)
    recipe = dataclasses.replace(recipe, runtime=dataclasses.replace(recipe.runtime, device=args.device))
    from tiny_llm.data.cache import open_cache
    from tiny_llm.data.tokenizer import load_tokenizer
    from tiny_llm.errors import ConfigError
    from tiny_llm.export.generate import generate, prompt_ids
    from tiny_llm.export.weights import load_model
    from tiny_llm.runtime.device import autocast_dtype, compute_context, setup_runtime

    device = setup_runtime(recipe)
    cache = open_cache(recipe.data.cache_dir, verify=False)
    cache.check_compatible(recipe)
    tokenizer = load_tokenizer(str(cache.path / "tokenizer"))
    model = load_model(recipe, checkpoint, device, worker=args.worker)
    ids = prompt_ids(tokenizer.encode_batch([args.prompt])[0], settings, cache.eos_token_id)
    context = recipe.model.context_length
    if len(ids) >= context:
        raise ConfigError(f"the prompt has {len(ids)} tokens; model.context_length {context} leaves no room")
    with compute_context(recipe, device):
        out = generate(
            model, ids, settings, eos_token_id=cache.eos_token_id, cache_dtype=autocast_dtype(recipe, device)
        )
    new = out.tokens[:-1] if out.stop_reason == "eos" else out.tokens
    completion = tokenizer.decode(new)
    if not args.json:
        print(args.prompt + completion)
        return 0
    rate = out.tokens_per_second
    print(
        json.dumps(
            {
                "prompt": args.prompt,
                "completion": completion,
                "prompt_tokens": out.prompt_tokens,
                "new_tokens": len(out.tokens),
                "token_ids": out.tokens,
                "stop_reason": out.stop_reason,
                "seconds": out.prefill_seconds + out.decode_seconds,
                "first_token_seconds": out.prefill_seconds,
                "decode_tokens_per_second": rate,
                "device": str(device),
                "checkpoint": str(checkpoint),
                "worker": args.worker,
                "settings": settings.as_dict(),
            },
            indent=2,
            ensure_ascii=False,
        )
    )
    return 0
