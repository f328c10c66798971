"""Helpers for the data-layer tests: hand-made C4-format corpora and synthetic token caches."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from tiny_llm.data.cache import DTYPE, MANIFEST_VERSION, manifest_identity
from tiny_llm.data.prepare import ShardWriter
from tiny_llm.io import atomic_write_json


def write_c4(directory: Path, split: str, rows: list[dict], shard: int = 0, num_shards: int = 1) -> Path:
    """One c4-{split}.NNNNN-of-NNNNN.json.gz file of JSON lines."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"c4-{split}.{shard:05d}-of-{num_shards:05d}.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def doc(text: str) -> dict:
    return {"text": text, "timestamp": "2019-04-25T00:00:00Z", "url": "https://example.org/"}


def synthetic_cache(path: Path, train: np.ndarray, validation: np.ndarray, shard_tokens: int) -> Path:
    """A complete cache holding the given token streams (manifest and checksums as prepare writes them)."""
    path.mkdir(parents=True)
    splits = {}
    for split, tokens in (("train", train), ("validation", validation)):
        writer = ShardWriter(path, split, shard_tokens)  # type: ignore[arg-type]
        writer.write(np.asarray(tokens, dtype=DTYPE))
        splits[split] = {"tokens": len(tokens), "shards": writer.close()}
    manifest = {
        "version": MANIFEST_VERSION,
        "dataset": "synthetic",
        "dataset_revision": None,
        "tokenizer": "synthetic",
        "tokenizer_revision": None,
        "tokenizer_fingerprint": "0" * 64,
        "vocab_size": 65536,
        "eos_token_id": 0,
        "dtype": DTYPE.str,
        "preprocessing": {
            "shuffle_seed": 0,
            "shuffle_buffer": 1,
            "append_eos": True,
            "add_special_tokens": False,
        },
        "validation_complete": True,
        "splits": splits,
    }
    manifest["identity"] = manifest_identity(manifest)
    atomic_write_json(path / "manifest.json", manifest)
    return path
