"""`prepare` throughput with 1 and more tokenizing worker processes (data.prepare_workers), in one run.

    python benchmarks/prepare_workers.py [--workers 1 2] [--repeat 4] [--trials 2] [--output FILE]

The corpus is the embedded demo corpus with its train split repeated --repeat times, the tokenizer a
4,096-token byte-level BPE trained on it (as benchmarks/prepare_throughput.py builds them). Each trial
prepares a fresh cache once per worker count, interleaved so a busy neighbour hits every count alike; the
fastest trial of each counts. Every cache is checked to be byte-identical to the first. Prints one JSON
object: tokens/s per worker count and ``ratio`` = tokens/s at the largest count / at the first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare_throughput import build_corpus  # noqa: E402
from report_out import emit  # noqa: E402


def cache_bytes(cache: Path) -> dict[str, bytes]:
    return {str(p.relative_to(cache)): p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default 1 2)")
    parser.add_argument("--repeat", type=int, default=4, help="copies of the demo train split (default 4)")
    parser.add_argument("--trials", type=int, default=2, help="interleaved trials; the fastest counts")
    parser.add_argument("--train-tokens", type=int, default=8_000_000, help="train tokens per cache")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()

    from tiny_llm.config import load_recipe
    from tiny_llm.data.prepare import prepare_cache
    from tiny_llm.data.sources import resolve_source
    from tiny_llm.data.tokenizer import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="prepare-workers-"))
    try:
        corpus = build_corpus(work, args.repeat)
        source = resolve_source(str(corpus), None)
        train_tokenizer((t for b in source.iter_texts("train", 256) for t in b), 4096, work / "tokenizer")
        sets = [
            "model.vocab_size=4096",
            f"data.dataset={corpus}",
            f"data.tokenizer={work / 'tokenizer'}",
            f"data.prepare_train_tokens={args.train_tokens}",
        ]
        seconds: dict[int, list[float]] = {n: [] for n in args.workers}
        tokens, reference = 0, None
        for trial in range(args.trials):
            for workers in args.workers:
                cache = work / f"cache-{trial}-{workers}"
                recipe = load_recipe(
                    ["demo-l"], [*sets, f"data.cache_dir={cache}", f"data.prepare_workers={workers}"]
                )
                started = time.perf_counter()
                result = prepare_cache(recipe, progress=False)
                seconds[workers].append(time.perf_counter() - started)
                tokens = result.train_tokens + result.validation_tokens
                written = cache_bytes(cache)
                reference = reference or written
                if written != reference:
                    raise SystemExit(f"cache with {workers} workers differs from the first one")
                shutil.rmtree(cache)
        rates = {n: round(tokens / min(s)) for n, s in seconds.items()}
        report = {
            "benchmark": "prepare_workers",
            "corpus": f"demo corpus, train x{args.repeat}",
            "tokens": tokens,
            "seconds": {n: [round(x, 3) for x in s] for n, s in seconds.items()},
            "tokens_per_second": rates,
            "ratio": round(rates[args.workers[-1]] / rates[args.workers[0]], 3),
            "identical_caches": True,
            "cpu_count": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
