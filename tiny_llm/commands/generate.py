"""`generate`: continue a prompt with a checkpoint (KV cache; greedy at --temperature 0)."""

from __future__ import annotations

import argparse
import json

from tiny_llm.commands.export import add_source_arguments, resolve_source
from tiny_llm.export.settings import SamplingConfig, sampling_from_dict

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
    flags = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k or None,
        "top_p": args.top_p,
        "seed": args.seed,
        "document_start": not args.no_document_start,
    }
    settings = sampling_from_dict(flags, "generate")
    recipe, checkpoint = resolve_source(args)
    from tiny_llm.export.generate import continue_text

    out = continue_text(recipe, checkpoint, args.prompt, settings, device=args.device, worker=args.worker)
    if args.json:
        print(json.dumps(out, indent=2, ensure_ascii=False))
    else:
        print(args.prompt + out["completion"])
    return 0
