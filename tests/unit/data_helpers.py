"""Helpers for the data-layer tests: hand-made C4-format corpora."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


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
