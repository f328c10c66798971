"""Helpers for the data-layer tests: hand-made C4-format corpora."""

from __future__ import annotations

import gzip
import json
import time
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


class FirstBatchLast:
    """Stands in for `prepare`'s worker function: the first batch submitted waits, in its worker process,
    until the second one is encoded, so it finishes after a later batch however idle or busy the machine is.
    Pickled once per submitted batch (in submission order), each copy carrying its number; ``marks`` gets a
    file per encoded batch (the first's says whether the second was done before it)."""

    def __init__(self, marks: Path) -> None:
        self.marks = marks
        self.number = self.submitted = 0

    def __getstate__(self) -> dict[str, object]:
        state = {"marks": self.marks, "number": self.submitted}
        self.submitted += 1
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.marks, self.number, self.submitted = state["marks"], state["number"], 0  # type: ignore[assignment]

    def __call__(self, texts: list[str]) -> object:
        from tiny_llm.data import prepare

        note = ""
        if self.number == 0:
            deadline = time.monotonic() + 120  # the event it waits for: the second batch's mark
            while not (self.marks / "1").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            note = "after 1" if (self.marks / "1").exists() else "alone"
        result = prepare._encode_in_worker(texts)
        (self.marks / str(self.number)).write_text(note)
        return result
