"""Token cache reader: manifest, shard checksums, compatibility and capacity checks, range reads.

Layout of a complete cache directory (immutable once published by `prepare`):
``manifest.json``, ``tokenizer/``, ``train-NNNNN.bin``, ``validation-NNNNN.bin`` holding raw
little-endian uint16 token streams (documents joined by EOS).
"""

from __future__ import annotations

import bisect
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tiny_llm.data.sources import SPLITS, Split, is_local_dataset
from tiny_llm.data.tokenizer import is_local_reference, load_tokenizer
from tiny_llm.errors import DamagedFileError, DataError
from tiny_llm.io import canonical_json, damaged_message, read_json

MANIFEST_VERSION = 1
DTYPE = np.dtype("<u2")
HASH_CHUNK = 8 << 20


def manifest_identity(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of every manifest field except ``identity``."""
    body = {k: v for k, v in manifest.items() if k != "identity"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(HASH_CHUNK)
        view = memoryview(buffer)
        while size := handle.readinto(buffer):
            digest.update(view[:size])
    return digest.hexdigest()


class TokenCache:
    """A complete token cache opened for reading (thread-safe positional reads)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self._shards = {split: manifest["splits"][split]["shards"] for split in SPLITS}
        self._starts = {
            split: _cumulative([s["tokens"] for s in shards]) for split, shards in self._shards.items()
        }
        self._fds: dict[str, int] = {}
        self._open_lock = threading.Lock()

    @property
    def identity(self) -> str:
        return self.manifest["identity"]

    @property
    def validation_complete(self) -> bool:
        return bool(self.manifest["validation_complete"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def eos_token_id(self) -> int:
        return int(self.manifest["eos_token_id"])

    def num_tokens(self, split: Split) -> int:
        return int(self.manifest["splits"][split]["tokens"])

    def shard_sizes(self, split: Split) -> list[int]:
        """Tokens of each physical shard of ``split``, in file order."""
        return [s["tokens"] for s in self._shards[split]]

    def read(self, split: Split, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of ``split`` as a fresh uint16 array; may span shards."""
        total = self.num_tokens(split)
        if not 0 <= start <= stop <= total:
            raise IndexError(f"{split} tokens [{start}, {stop}) outside [0, {total})")
        out = np.empty(stop - start, dtype=DTYPE)
        starts, shards = self._starts[split], self._shards[split]
        index = bisect.bisect_right(starts, start) - 1
        position = start
        while position < stop:
            shard_start = starts[index]
            take = min(stop, shard_start + shards[index]["tokens"]) - position
            target = memoryview(out[position - start : position - start + take].data).cast("B")
            self._pread(shards[index]["file"], target, (position - shard_start) * DTYPE.itemsize)
            position += take
            index += 1
        return out

    def _pread(self, file: str, target: memoryview, offset: int) -> None:
        fd = self._fds.get(file)
        if fd is None:
            with self._open_lock:  # the loader's prefetch thread reads concurrently
                fd = self._fds.get(file)
                if fd is None:
                    fd = self._fds[file] = os.open(self.path / file, os.O_RDONLY)
        done = 0
        while done < len(target):
            got = os.preadv(fd, [target[done:]], offset + done)
            if got == 0:
                raise DataError(f"token cache {self.path}: {file} is shorter than its manifest says")
            done += got

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> TokenCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def verify(self) -> None:
        """Re-hash every shard (in parallel threads) and compare with the manifest."""
        jobs = [(split, shard) for split in SPLITS for shard in self._shards[split]]
        workers = min(4, len(os.sched_getaffinity(0)), max(1, len(jobs)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            digests = list(pool.map(lambda job: sha256_file(self.path / job[1]["file"]), jobs))
        for (_, shard), digest in zip(jobs, digests, strict=True):
            if digest != shard["sha256"]:
                raise DataError(
                    f"token cache {self.path}: {shard['file']} is corrupt (sha256 mismatch); delete the "
                    "cache directory and run prepare again"
                )

    def token_bytes(self) -> np.ndarray | None:
        """UTF-8 bytes of each token id's text under the cache's tokenizer (``TextTokenizer.token_bytes``,
        EOS 0), for bits per byte; None for a cache without a tokenizer (synthetic tokens)."""
        directory = self.path / "tokenizer"
        if not directory.is_dir():
            return None
        sizes = np.zeros(self.vocab_size, dtype=np.int64)
        found = load_tokenizer(str(directory)).token_bytes()[: self.vocab_size]
        sizes[: len(found)] = found
        sizes[self.eos_token_id] = 0  # documents are joined by EOS: never text, whatever the tokenizer says
        return sizes

    def check_capacity(self, tokens_needed: int) -> None:
        """The train split must hold ``tokens_needed`` tokens (a training run reads a prefix)."""
        have = self.num_tokens("train")
        if tokens_needed > have:
            raise DataError(
                f"cache too small: need {tokens_needed} tokens, have {have} ({self.path}); prepare a larger "
                "cache in a new data.cache_dir"
            )

    def check_compatible(self, recipe: Any) -> None:
        """Raise naming the first recipe field this cache was not built with."""
        for key, cached, wanted in compatibility_fields(self.manifest, recipe):
            if not _same(key, cached, wanted, self.manifest):
                raise DataError(
                    f"token cache {self.path} was built with {key}={cached!r} but the recipe has {wanted!r}; "
                    "use a data.cache_dir prepared for this recipe"
                )


def compatibility_fields(manifest: dict[str, Any], recipe: Any) -> list[tuple[str, Any, Any]]:
    """(recipe key, value in the cache, value in the recipe) for everything a cache must agree on."""
    data = recipe.data
    dataset_revision = None if is_local_dataset(data.dataset) else data.dataset_revision
    tokenizer_revision = None if is_local_reference(data.tokenizer) else data.tokenizer_revision
    pre = manifest["preprocessing"]
    return [
        ("model.vocab_size", manifest["vocab_size"], recipe.model.vocab_size),
        ("data.dataset", manifest["dataset"], data.dataset),
        ("data.dataset_revision", manifest["dataset_revision"], dataset_revision),
        ("data.tokenizer", manifest["tokenizer"], data.tokenizer),
        ("data.tokenizer_revision", manifest["tokenizer_revision"], tokenizer_revision),
        ("data.shuffle_seed", pre["shuffle_seed"], data.shuffle_seed),
        ("data.shuffle_buffer", pre["shuffle_buffer"], data.shuffle_buffer),
    ]


def _same(key: str, cached: Any, wanted: Any, manifest: dict[str, Any]) -> bool:
    if cached == wanted:
        return True
    if key == "data.dataset" and _is_local_pair(cached, wanted):
        return Path(cached).expanduser().resolve() == Path(wanted).expanduser().resolve()
    if key == "data.tokenizer" and is_local_reference(wanted) and Path(wanted).expanduser().exists():
        # A local tokenizer may be named by another path; what counts is its content.
        return load_tokenizer(wanted).fingerprint == manifest["tokenizer_fingerprint"]
    return False


def _is_local_pair(a: Any, b: Any) -> bool:
    return (
        isinstance(a, str)
        and isinstance(b, str)
        and Path(a).expanduser().exists()
        and Path(b).expanduser().exists()
    )


def _cumulative(sizes: list[int]) -> list[int]:
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += size
    return starts


def rebuild_hint(path: Path) -> str:
    """How to make a damaged cache again: prepare reuses a directory that holds a manifest (and refuses a
    non-empty one without), so deleting the manifest alone, or rerunning prepare as it is, leads nowhere."""
    return f"delete the token cache directory {path} and run prepare again"


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a complete cache, structurally checked; DataError otherwise."""
    file = path / "manifest.json"
    if not path.is_dir():
        raise DataError(f"token cache not found: {path}; run `tiny-llm prepare` with this data.cache_dir")
    if not file.is_file():
        raise DataError(
            f"{path} is not a complete token cache (no manifest.json); run prepare into a new directory"
        )
    try:
        manifest = read_json(file, rebuild_hint(path))
    except DamagedFileError as exc:
        raise DataError(str(exc)) from None
    try:
        version = manifest["version"]
        for split in SPLITS:
            for shard in manifest["splits"][split]["shards"]:
                shard["file"], shard["tokens"], shard["sha256"]  # noqa: B018 - structural check
    except (KeyError, TypeError) as exc:
        reason = f"missing field {exc}" if isinstance(exc, KeyError) else f"not a cache manifest: {exc}"
        raise DataError(damaged_message(file, reason, rebuild_hint(path))) from None
    if version != MANIFEST_VERSION:
        raise DataError(
            f"token cache {path}: manifest version {version}, expected {MANIFEST_VERSION}; prepare a new "
            f"data.cache_dir, or {rebuild_hint(path)}"
        )
    if manifest.get("identity") != manifest_identity(manifest):
        raise DataError(
            f"token cache {path}: manifest.json was modified (identity mismatch); {rebuild_hint(path)}"
        )
    return manifest


def open_cache(path: str | os.PathLike[str], verify: bool = True) -> TokenCache:
    """Open a complete token cache; with ``verify`` every shard's sha256 is checked first."""
    path = Path(path)
    manifest = read_manifest(path)
    for split in SPLITS:
        shards = manifest["splits"][split]["shards"]
        if sum(s["tokens"] for s in shards) != manifest["splits"][split]["tokens"]:
            raise DataError(
                f"token cache {path}: {split} shard sizes disagree with the manifest; {rebuild_hint(path)}"
            )
        for shard in shards:
            file = path / shard["file"]
            expected = shard["tokens"] * DTYPE.itemsize
            if not file.is_file() or file.stat().st_size != expected:
                raise DataError(
                    f"token cache {path}: {shard['file']} is missing or has the wrong size; delete the cache "
                    "directory and run prepare again"
                )
    cache = TokenCache(path, manifest)
    if verify:
        cache.verify()
    return cache
