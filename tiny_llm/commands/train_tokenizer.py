"""`train-tokenizer`: a byte-level BPE tokenizer trained on a C4-format directory's train split."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="C4-format directory (c4-train.*.json.gz)")
    parser.add_argument("--vocab-size", type=int, required=True, help="tokens, specials included")
    parser.add_argument("--output", required=True, help="tokenizer directory (new, or empty; data.tokenizer)")
    parser.add_argument("--force", action="store_true", help="replace an earlier tokenizer in --output")


def run(args: argparse.Namespace) -> int:
    from tiny_llm.data.sources import resolve_source
    from tiny_llm.data.tokenizer import train_tokenizer
    from tiny_llm.output_dirs import check_replaceable

    check_replaceable(args.output, force=args.force)  # before reading any text
    started = time.perf_counter()
    source = resolve_source(args.input, None)
    source.data_files("train")
    texts = (text for batch in source.iter_texts("train", batch_size=256) for text in batch)
    tokenizer = train_tokenizer(texts, args.vocab_size, Path(args.output), force=args.force)
    summary = {
        "output": args.output,
        "vocab_size": tokenizer.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "fingerprint": tokenizer.fingerprint,
        "seconds": round(time.perf_counter() - started, 3),
    }
    print(json.dumps(summary, indent=2))
    return 0
