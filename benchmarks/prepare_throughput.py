"""Token-cache preparation throughput vs the tokenizer's own batch-encode throughput, on the same text.

    python benchmarks/prepare_throughput.py [--corpus DIR] [--tokenizer PATH] [--repeat N] [--trials N]

Without --corpus the embedded demo corpus is built (repeated --repeat times, so the timed part is long
enough); without --tokenizer a 4,096-token byte-level BPE is trained on it. Both measurements see the same
documents: (1) every document of both splits, already in memory, encoded with the tokenizer's batch call
at data.tokenize_batch_size; (2) `prepare_cache` end to end (read .json.gz, shuffle, encode, EOS,
uint16 shards, sha256, fsync, manifest). The two alternate for --trials rounds and the fastest of each
counts. Prints one JSON object; ``ratio`` = (2) / (1) in tokens per wall second, ``cpu_ratio`` = the same
in tokens per CPU second of the process (less sensitive to other work on a shared machine);
``prepare_without_encoding_*``: prepare with the tokenizer's answers looked up (all the work besides
encoding: reading, shuffling, EOS, writing, hashing, fsync). ``loader``:
the training loader at the 20M shape (L=1024, 64 MiB ranges, 128-block microbatches) on a synthetic cache.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report_out import emit  # noqa: E402


def build_corpus(work: Path, repeat: int) -> Path:
    from tiny_llm.data.corpus import Document, demo_documents, split_documents, write_c4_dir

    train, validation = split_documents(demo_documents(), 0.05)
    copies = [Document(d.text, f"{d.url}?copy={i}") for i in range(repeat) for d in train]
    write_c4_dir(work / "corpus", copies, validation)
    return work / "corpus"


def read_all(corpus: Path, batch_size: int) -> dict[str, list[list[str]]]:
    from tiny_llm.data.sources import resolve_source

    source = resolve_source(str(corpus), None)
    return {split: list(source.iter_texts(split, batch_size)) for split in ("validation", "train")}


def encode_all(tokenizer, batches: dict[str, list[list[str]]]) -> dict[str, int]:
    """Tokens per split, with the EOS prepare appends."""
    tokens = {}
    for split, split_batches in batches.items():
        # +1 per document: the EOS that prepare appends
        tokens[split] = sum(len(ids) + 1 for texts in split_batches for ids in tokenizer.encode_batch(texts))
    return tokens


def loader_timings(work: Path, context_length: int = 1024, micro_batch: int = 128) -> dict[str, float]:
    """TrainLoader at the 20M shape on a synthetic cache: range reads and batch assembly."""
    import numpy as np

    from tiny_llm.data.cache import open_cache
    from tiny_llm.data.loader import TrainLoader
    from tiny_llm.data.prepare import write_token_cache

    num_blocks = 70_000  # a bit over two 64 MiB ranges
    rng = np.random.default_rng(0)
    train = rng.integers(0, 32000, num_blocks * context_length + 1, dtype=np.uint16)
    path = write_token_cache(work / "loader-cache", train, train[:100_000], shard_tokens=16_777_216)
    with open_cache(path) as cache:
        started = time.perf_counter()
        open_cache(path, verify=True).close()
        verify_seconds = time.perf_counter() - started
        loader = TrainLoader(cache, context_length, num_blocks, seed=42, buffer_size_mib=64, prefetch=False)
        reads = []
        for position in range(3):
            started = time.perf_counter()
            loader._load(position)
            reads.append(time.perf_counter() - started)
        loader.close()
        loader = TrainLoader(cache, context_length, num_blocks, seed=42, buffer_size_mib=64, prefetch=True)
        loader.next_blocks(micro_batch)
        assembly = []
        for _ in range(200):
            started = time.perf_counter()
            loader.next_blocks(micro_batch)
            assembly.append(time.perf_counter() - started)
        loader.close()
    return {
        "context_length": context_length,
        "blocks_per_range": loader.blocks_per_range,
        "verify_gib_per_second": round(
            sum(f.stat().st_size for f in path.glob("*.bin")) / 2**30 / verify_seconds, 3
        ),
        "range_read_seconds_median": round(float(np.median(reads)), 4),
        "batch_assembly_ms_median": round(float(np.median(assembly)) * 1e3, 3),
        "micro_batch_blocks": micro_batch,
    }


class Memoized:
    """The tokenizer with its answers looked up: what prepare costs besides encoding."""

    def __init__(self, tokenizer, batches: dict[str, list[list[str]]]) -> None:
        self.inner = tokenizer
        self.ids = {
            t: ids
            for b in batches.values()
            for texts in b
            for t, ids in zip(texts, tokenizer.encode_batch(texts), strict=True)
        }

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.ids[t] for t in texts]

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def timed(function, *args, **kwargs):
    """(result, wall seconds, CPU seconds of all threads of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", help="C4-format directory (default: the demo corpus, repeated)")
    parser.add_argument("--tokenizer", help="tokenizer path (default: train a 4,096-token BPE on the corpus)")
    parser.add_argument("--repeat", type=int, default=4, help="copies of the demo train split (default 4)")
    parser.add_argument("--batch-size", type=int, default=256, help="data.tokenize_batch_size")
    parser.add_argument(
        "--trials", type=int, default=3, help="interleaved encode/prepare trials; best counts"
    )
    parser.add_argument("--no-loader", action="store_true", help="skip the training-loader timings")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()

    from tiny_llm.config import load_recipe
    from tiny_llm.data.prepare import prepare_cache
    from tiny_llm.data.tokenizer import load_tokenizer, train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        corpus = Path(args.corpus) if args.corpus else build_corpus(work, args.repeat)
        batches = read_all(corpus, args.batch_size)
        if args.tokenizer:
            tokenizer_path = args.tokenizer
        else:
            tokenizer_path = str(work / "tokenizer")
            texts = (t for batch in batches["train"] for t in batch)
            train_tokenizer(texts, 4096, Path(tokenizer_path))
        tokenizer = load_tokenizer(tokenizer_path)
        split_tokens = encode_all(tokenizer, batches)  # warm-up, and the token counts
        encode_tokens = sum(split_tokens.values())
        recipe_sets = [
            f"model.vocab_size={tokenizer.vocab_size}",
            f"data.dataset={corpus}",
            f"data.tokenizer={tokenizer_path}",
            f"data.prepare_train_tokens={split_tokens['train']}",
            f"data.tokenize_batch_size={args.batch_size}",
        ]
        encode_runs, prepare_runs = [], []
        for trial in range(args.trials):  # interleaved, so a busy neighbour hits both alike
            _, seconds, cpu = timed(encode_all, tokenizer, batches)
            encode_runs.append((seconds, cpu))
            recipe = load_recipe(["demo-l"], [*recipe_sets, f"data.cache_dir={work / f'cache-{trial}'}"])
            result, seconds, cpu = timed(prepare_cache, recipe, progress=False)
            assert result.train_tokens + result.validation_tokens == encode_tokens
            prepare_runs.append((seconds, cpu))
        encode_best, prepare_best = min(encode_runs), min(prepare_runs)
        memoized = Memoized(tokenizer, batches)
        recipe = load_recipe(["demo-l"], [*recipe_sets, f"data.cache_dir={work / 'cache-memo'}"])
        _, other_seconds, other_cpu = timed(prepare_cache, recipe, progress=False, tokenizer=memoized)
        report = {
            "benchmark": "prepare_throughput",
            "corpus": str(corpus) if args.corpus else f"demo corpus, train x{args.repeat}",
            "tokenizer": tokenizer_path if args.tokenizer else "byte-level BPE 4096 trained on the corpus",
            "tokenize_batch_size": args.batch_size,
            "tokens": encode_tokens,
            "trials": args.trials,
            "encode_seconds": [round(s, 3) for s, _ in encode_runs],
            "prepare_seconds": [round(s, 3) for s, _ in prepare_runs],
            "encode_tokens_per_second": round(encode_tokens / encode_best[0]),
            "prepare_tokens_per_second": round(encode_tokens / prepare_best[0]),
            "ratio": round(encode_best[0] / prepare_best[0], 3),
            "encode_cpu_seconds": [round(c, 3) for _, c in encode_runs],
            "prepare_cpu_seconds": [round(c, 3) for _, c in prepare_runs],
            "cpu_ratio": round(min(c for _, c in encode_runs) / min(c for _, c in prepare_runs), 3),
            "prepare_without_encoding_seconds": round(other_seconds, 3),
            "prepare_without_encoding_cpu_seconds": round(other_cpu, 3),
            "cpu_count": os.cpu_count(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS"),
            "python": platform.python_version(),
        }
        if not args.no_loader:
            report["loader"] = loader_timings(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(report, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
