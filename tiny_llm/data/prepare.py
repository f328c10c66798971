"""`prepare`: tokenize a corpus into a token cache, or verify and reuse a compatible one.

Publishing is atomic: shards are written into ``<cache>.partial/``, each fsynced and hashed, then the
manifest, then the directory is renamed to ``<cache>``. A sibling ``<cache>.lock`` (flock) makes a
second preparer fail fast; a ``.partial`` found while holding the lock is stale (its writer died) and
is removed when it carries the marker its preparer writes first (anything else there is refused and
kept). A complete cache is never modified: more tokens or other settings need a new directory.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import multiprocessing
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.synchronize import Barrier as BarrierType
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from tiny_llm.budget import make_budget
from tiny_llm.config import RecipeConfig
from tiny_llm.data.cache import DTYPE, MANIFEST_VERSION, TokenCache, manifest_identity, open_cache
from tiny_llm.data.sources import CorpusSource, Split, resolve_source
from tiny_llm.data.tokenizer import (
    MAX_UINT16_VOCAB,
    SentencePieceTokenizer,
    TextTokenizer,
    check_tokenizer,
    is_local_reference,
    load_tokenizer,
)
from tiny_llm.errors import DataError, DiskFullError
from tiny_llm.io import atomic_write_json, exclusive_lock, fsync_dir, is_disk_full
from tiny_llm.output_dirs import OUTPUT_MARKER

T = TypeVar("T")
PREFETCH_BATCHES = 8
ENCODE_AHEAD = 2


@dataclass(frozen=True)
class PrepareResult:
    """What `prepare` did."""

    path: str
    identity: str
    reused: bool
    train_tokens: int
    validation_tokens: int
    validation_complete: bool
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def train_tokens_needed(recipe: RecipeConfig) -> int:
    """data.prepare_train_tokens, else the budget's targets + 1 (the first input token)."""
    if recipe.data.prepare_train_tokens is not None:
        return recipe.data.prepare_train_tokens
    return make_budget(recipe).cache_tokens_needed


def prepare_cache(
    recipe: RecipeConfig, progress: bool = True, tokenizer: TextTokenizer | None = None
) -> PrepareResult:
    """Make ``recipe.data.cache_dir`` a complete cache that serves ``recipe`` (reusing one if possible).

    ``tokenizer`` replaces loading ``data.tokenizer`` (a caller that already holds it; benchmarks).
    """
    started = time.perf_counter()
    cache_dir = Path(recipe.data.cache_dir)
    need = train_tokens_needed(recipe)
    if need < 2:
        raise DataError(f"data.prepare_train_tokens: need at least 2 train tokens, got {need}")
    validation_cap = recipe.data.prepare_validation_tokens
    if validation_cap is not None and validation_cap < 2:
        raise DataError(
            f"data.prepare_validation_tokens: need at least 2 tokens or null, got {validation_cap}"
        )
    if (cache_dir / "manifest.json").exists():
        return _reuse(cache_dir, recipe, need, started)
    if cache_dir.exists() and (not cache_dir.is_dir() or any(cache_dir.iterdir())):
        raise DataError(
            f"data.cache_dir {cache_dir} exists but is not a token cache; choose an empty or new path"
        )
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache_dir.with_name(cache_dir.name + ".lock"), f"token cache {cache_dir}"):
        if (cache_dir / "manifest.json").exists():  # another preparer published it while we waited to start
            return _reuse(cache_dir, recipe, need, started)
        partial = cache_dir.with_name(cache_dir.name + ".partial")
        remove_stale_partial(partial)
        partial.mkdir()
        try:
            (partial / OUTPUT_MARKER).write_text(PARTIAL_MARKER_TEXT)  # ours to delete, should we die
            manifest = _write_cache(partial, recipe, need, progress, tokenizer)
            if cache_dir.exists():
                cache_dir.rmdir()  # an empty placeholder directory
            os.replace(partial, cache_dir)
            (cache_dir / OUTPUT_MARKER).unlink()  # the cache holds what it always held
            fsync_dir(cache_dir.parent)
        except BaseException as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if is_disk_full(exc):
                raise DiskFullError(
                    f"disk full: no space left on the device holding {cache_dir.parent} while writing the "
                    f"token cache into {partial} (its train split alone takes "
                    f"{need * DTYPE.itemsize / 2**20:,.1f} MiB); the partial cache was removed and nothing "
                    f"was published at {cache_dir}; free space there and rerun the same command"
                ) from exc
            raise
    val = manifest["splits"]["validation"]["tokens"]
    return PrepareResult(
        path=str(cache_dir),
        identity=manifest["identity"],
        reused=False,
        train_tokens=manifest["splits"]["train"]["tokens"],
        validation_tokens=val,
        validation_complete=manifest["validation_complete"],
        seconds=time.perf_counter() - started,
    )


PARTIAL_MARKER_TEXT = "a token cache being written by tiny-llm prepare; deleted if its preparer died\n"


def remove_stale_partial(partial: Path) -> None:
    """Delete the ``<cache>.partial`` of a preparer that died (the caller holds the cache's lock): only one
    carrying our OUTPUT_MARKER, or an empty one; a directory or file of anyone else's is refused, kept."""
    if not partial.exists() and not partial.is_symlink():
        return
    if partial.is_symlink() or not partial.is_dir():
        raise DataError(f"{partial} is in the way of the token cache's partial copy; move it away and rerun")
    if (partial / OUTPUT_MARKER).is_file():
        _log(f"removing stale partial cache {partial} (its preparer did not finish)")
        shutil.rmtree(partial)
    elif any(partial.iterdir()):
        raise DataError(
            f"{partial} is not a partial cache tiny-llm wrote (no {OUTPUT_MARKER}), and the token cache is "
            "written there before it is published: move it away and rerun, or choose another data.cache_dir"
        )
    else:
        partial.rmdir()


def _reuse(cache_dir: Path, recipe: RecipeConfig, need: int, started: float) -> PrepareResult:
    with open_cache(cache_dir, verify=True) as cache:
        cache.check_compatible(recipe)
        _check_tokenizer_unchanged(cache, recipe)
        cache.check_capacity(need)
        _check_validation(cache, recipe.data.prepare_validation_tokens)
        return PrepareResult(
            path=str(cache_dir),
            identity=cache.identity,
            reused=True,
            train_tokens=cache.num_tokens("train"),
            validation_tokens=cache.num_tokens("validation"),
            validation_complete=cache.validation_complete,
            seconds=time.perf_counter() - started,
        )


def _check_tokenizer_unchanged(cache: TokenCache, recipe: RecipeConfig) -> None:
    name = recipe.data.tokenizer
    if not (is_local_reference(name) and Path(name).expanduser().exists()):
        return  # a hub tokenizer is pinned by its revision, which check_compatible compares
    if load_tokenizer(name).fingerprint != cache.manifest["tokenizer_fingerprint"]:
        raise DataError(
            f"tokenizer {name} changed since token cache {cache.path} was built; prepare a new data.cache_dir"
        )


def _check_validation(cache: TokenCache, cap: int | None) -> None:
    if cache.validation_complete:
        return
    have = cache.num_tokens("validation")
    if cap is None or cap > have:
        wanted = "all validation tokens" if cap is None else f"{cap} validation tokens"
        raise DataError(
            f"token cache {cache.path} holds a truncated validation split ({have} tokens) but the recipe "
            f"asks for {wanted}; prepare a new data.cache_dir"
        )


# ----------------------------------------------------------------------------- writing


def _write_cache(
    partial: Path, recipe: RecipeConfig, need: int, progress: bool, tokenizer: TextTokenizer | None
) -> dict[str, Any]:
    data = recipe.data
    source = resolve_source(data.dataset, data.dataset_revision)
    source.check_available()
    tokenizer = tokenizer or load_tokenizer(data.tokenizer, data.tokenizer_revision)
    check_tokenizer(tokenizer, recipe.model.vocab_size, data.tokenizer)
    (partial / "tokenizer").mkdir()
    tokenizer.save(partial / "tokenizer")
    with worker_pool(data.prepare_workers, partial / "tokenizer", tokenizer.fingerprint) as pool:
        writer = SplitWriter(
            source, tokenizer, data.tokenize_batch_size, data.shard_tokens, progress, pool=pool
        )
        validation, complete = writer.write(partial, "validation", data.prepare_validation_tokens)
        if validation["tokens"] < 2:
            raise DataError(f"dataset {data.dataset}: the validation split holds no text")
        train, _ = writer.write(partial, "train", need, data.shuffle_seed, data.shuffle_buffer)
    if train["tokens"] < need:
        raise DataError(
            f"dataset {data.dataset}: the train split has only {train['tokens']} tokens, need {need}; use a "
            "larger corpus or a smaller budget (training.tokens_per_parameter or data.prepare_train_tokens)"
        )
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "dataset": data.dataset,
        "dataset_revision": source.revision,
        "tokenizer": data.tokenizer,
        "tokenizer_revision": None if is_local_reference(data.tokenizer) else data.tokenizer_revision,
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "vocab_size": tokenizer.vocab_size,
        "eos_token_id": tokenizer.eos_token_id,
        "dtype": DTYPE.str,
        "preprocessing": {
            "shuffle_seed": data.shuffle_seed,
            "shuffle_buffer": data.shuffle_buffer,
            "append_eos": True,
            "add_special_tokens": False,
        },
        "validation_complete": complete,
        "splits": {"train": train, "validation": validation},
    }
    return write_manifest(partial, manifest)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Add the identity and write manifest.json atomically (the last file of a cache)."""
    manifest = {**manifest, "identity": manifest_identity(manifest)}
    atomic_write_json(directory / "manifest.json", manifest)  # the umask's mode, like the shards
    return manifest


def write_token_cache(
    path: Path, train: np.ndarray, validation: np.ndarray, shard_tokens: int, **fields: Any
) -> Path:
    """A complete cache holding the given token streams, published like `prepare` does (synthetic data for
    benchmarks and tests); ``fields`` override the descriptive manifest fields."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.mkdir(parents=True)
    splits = {}
    streams: tuple[tuple[Split, np.ndarray], ...] = (("train", train), ("validation", validation))
    for split, tokens in streams:
        writer = ShardWriter(partial, split, shard_tokens)
        writer.write(np.asarray(tokens, dtype=DTYPE))
        splits[split] = {"tokens": len(tokens), "shards": writer.close()}
    manifest = {
        "version": MANIFEST_VERSION,
        "dataset": "synthetic",
        "dataset_revision": None,
        "tokenizer": "synthetic",
        "tokenizer_revision": None,
        "tokenizer_fingerprint": "0" * 64,
        "vocab_size": MAX_UINT16_VOCAB,
        "eos_token_id": 0,
        "dtype": DTYPE.str,
        "preprocessing": {
            "shuffle_seed": 0,
            "shuffle_buffer": 1,
            "append_eos": True,
            "add_special_tokens": False,
        },
        "validation_complete": True,
    }
    write_manifest(partial, {**manifest, **fields, "splits": splits})
    os.replace(partial, path)
    fsync_dir(path.parent)
    return path


class ShardWriter:
    """Raw uint16 shards of ``shard_tokens`` tokens, each hashed while written and fsynced when full."""

    def __init__(self, directory: Path, split: Split, shard_tokens: int) -> None:
        self.directory, self.split, self.shard_tokens = directory, split, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._handle: Any = None
        self._digest: Any = None
        self._filled = 0

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self._handle is None:
                self._open()
            take = min(len(tokens), self.shard_tokens - self._filled)
            chunk = tokens[:take].astype(DTYPE, copy=False).tobytes()
            self._handle.write(chunk)
            self._digest.update(chunk)
            self._filled += take
            tokens = tokens[take:]
            if self._filled == self.shard_tokens:
                self._finish()

    def close(self) -> list[dict[str, Any]]:
        if self._handle is not None:
            self._finish()
        return self.shards

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._handle = open(self.directory / name, "wb")  # noqa: SIM115 - closed in _finish
        self._digest = hashlib.sha256()
        self._filled = 0
        self.shards.append({"file": name, "tokens": 0, "sha256": ""})

    def _finish(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        self.shards[-1].update(tokens=self._filled, sha256=self._digest.hexdigest())
        self._handle = None


@dataclass
class SplitWriter:
    """Streams one split: read documents (background thread), batch-encode, append EOS, write shards."""

    source: CorpusSource
    tokenizer: TextTokenizer
    batch_size: int
    shard_tokens: int
    progress: bool
    pool: WorkerPool | None = None
    """Tokenizing processes (``worker_pool``); None = a thread of this process."""

    def write(
        self, directory: Path, split: Split, limit: int | None, seed: int | None = None, buffer: int = 0
    ) -> tuple[dict[str, Any], bool]:
        """Write up to ``limit`` tokens; return the manifest entry and whether the split was exhausted."""
        from tqdm import tqdm

        shards = ShardWriter(directory, split, self.shard_tokens)
        written, documents, exhausted = 0, 0, True
        bar = tqdm(
            total=limit, unit="tok", unit_scale=True, desc=f"prepare {split}", disable=not self.progress
        )
        texts = background(self.source.iter_texts(split, self.batch_size, seed, buffer), PREFETCH_BATCHES)
        batches = self._encoded(texts)
        try:
            for num_documents, tokens in batches:
                if limit is not None and written + len(tokens) >= limit:
                    exhausted = written + len(tokens) == limit and next(batches, None) is None
                    tokens = tokens[: limit - written]
                shards.write(tokens)
                written += len(tokens)
                documents += num_documents
                bar.update(len(tokens))
                bar.set_postfix(docs=documents, shards=len(shards.shards), refresh=False)
                if limit is not None and written >= limit:
                    break
        finally:
            batches.close()
            bar.close()
        return {"tokens": written, "shards": shards.close()}, exhausted

    def _encoded(self, texts: Iterator[list[str]]) -> Generator[tuple[int, np.ndarray], None, None]:
        """(documents, tokens) per batch of ``texts``, in their order, however many workers encode them."""
        if self.pool is None:
            # Encoding runs in its own thread (the tokenizer releases the GIL), overlapping reads and writes.
            return background(self._encode(texts), ENCODE_AHEAD)
        # Not in a thread: closing this generator stops the encoding before the caller publishes the cache.
        return encode_in_processes(texts, self.pool)

    def _encode(self, batches: Iterator[list[str]]) -> Iterator[tuple[int, np.ndarray]]:
        try:
            for texts in batches:
                yield (
                    len(texts),
                    join_with_eos(self.tokenizer.encode_batch(texts), self.tokenizer.eos_token_id),
                )
        finally:
            batches.close()  # type: ignore[attr-defined]


_WORKER_TOKENIZER: TextTokenizer | None = None
_ALL_STARTED: BarrierType | None = None


@dataclass(frozen=True)
class WorkerPool:
    """Processes that tokenize for one `prepare` (both splits), each holding the saved tokenizer."""

    executor: ProcessPoolExecutor
    workers: int


@contextlib.contextmanager
def worker_pool(workers: int, tokenizer_dir: Path, fingerprint: str) -> Iterator[WorkerPool | None]:
    """``workers`` tokenizing processes (None for 1: the preparing process encodes).

    Each process loads the saved tokenizer and checks it against ``fingerprint``, so the tokens, and the
    cache's bytes, are those of one process. Spawned, not forked: the reader thread and the tokenizer's
    thread pool would not survive a fork.

    Every worker is started before the first batch is sent. A spawning executor otherwise starts workers
    as work is submitted, and one started while the executor handles a killed worker escapes its clean-up:
    the executor then waits on it for ever instead of reporting the death (Python 3.11).
    """
    if workers == 1:
        yield None
        return
    context = multiprocessing.get_context("spawn")
    all_started = context.Barrier(workers)
    executor = ProcessPoolExecutor(
        workers,
        mp_context=context,
        initializer=_load_worker_tokenizer,
        initargs=(str(tokenizer_dir), fingerprint, all_started),
    )
    with executor:
        # Each of these waits for the others, so none ends before ``workers`` processes run them.
        for started in [_submit(executor, _wait_for_all_workers) for _ in range(workers)]:
            _result(started)
        yield WorkerPool(executor, workers)


def encode_in_processes(
    batches: Iterator[list[str]], pool: WorkerPool
) -> Generator[tuple[int, np.ndarray], None, None]:
    """(documents, tokens) per batch, encoded by ``pool``, in input order.

    At most ``workers x ENCODE_AHEAD`` batches are in flight (an executor's own map would read the whole
    corpus ahead); closing the generator cancels what has not started and waits for what has.
    """
    pending: collections.deque[Future[tuple[int, np.ndarray]]] = collections.deque()
    try:
        for texts in batches:
            pending.append(_submit(pool.executor, _encode_in_worker, texts))
            if len(pending) >= pool.workers * ENCODE_AHEAD:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    finally:
        for future in pending:
            future.cancel()
        for future in pending:
            if not future.cancelled():
                future.exception()  # wait: nothing may still run when the split's shards are closed
        close = getattr(batches, "close", None)
        if close is not None:
            close()


WORKER_DIED = (
    "prepare: a tokenizing worker process died (killed by a signal: out of memory, or stopped by hand), so "
    "nothing was published; rerun the same command, with a lower data.prepare_workers if memory ran out"
)


def _submit(executor: ProcessPoolExecutor, fn: Callable[..., T], *args: object) -> Future[T]:
    try:
        return executor.submit(fn, *args)
    except BrokenProcessPool:
        raise DataError(WORKER_DIED) from None


def _result(future: Future[T]) -> T:
    """A batch's tokens (or a start's None); a worker that died (the kernel's OOM killer, a kill) is one
    line, not the executor's BrokenProcessPool traceback."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise DataError(WORKER_DIED) from None


def _load_worker_tokenizer(directory: str, fingerprint: str, all_started: BarrierType) -> None:
    global _WORKER_TOKENIZER, _ALL_STARTED
    _ALL_STARTED = all_started
    # One core per worker (N workers use N cores): the tokenizers' own thread pools would oversubscribe.
    os.environ["RAYON_NUM_THREADS"] = "1"
    tokenizer = load_tokenizer(directory)
    if isinstance(tokenizer, SentencePieceTokenizer):
        tokenizer.num_threads = 1
    if tokenizer.fingerprint != fingerprint:
        raise DataError(f"prepare worker: the tokenizer saved in {directory} differs from the preparer's")
    _WORKER_TOKENIZER = tokenizer


def _wait_for_all_workers() -> None:
    assert _ALL_STARTED is not None, "the pool's initializer ran"
    _ALL_STARTED.wait()


def _encode_in_worker(texts: list[str]) -> tuple[int, np.ndarray]:
    assert _WORKER_TOKENIZER is not None, "the pool's initializer loads the tokenizer"
    return len(texts), join_with_eos(_WORKER_TOKENIZER.encode_batch(texts), _WORKER_TOKENIZER.eos_token_id)


def join_with_eos(ids: list[list[int]], eos: int) -> np.ndarray:
    """Concatenate documents, each followed by EOS, as one uint16 array."""
    total = sum(map(len, ids)) + len(ids)
    pieces = itertools.chain.from_iterable(itertools.chain.from_iterable(zip(ids, itertools.repeat((eos,)))))
    return np.fromiter(pieces, dtype=DTYPE, count=total)


def background(iterator: Iterator[T], depth: int) -> Generator[T, None, None]:
    """Run ``iterator`` in a daemon thread, ``depth`` items ahead; re-raise its errors here."""
    items: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: str, value: Any) -> bool:
        while not stop.is_set():
            try:
                items.put((kind, value), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in iterator:
                if not put("item", item):
                    return
            put("end", None)
        except BaseException as exc:  # handed to the consumer
            put("error", exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # stops an upstream background() thread too

    thread = threading.Thread(target=produce, name="prepare-reader", daemon=True)
    thread.start()

    def consume() -> Generator[T, None, None]:
        try:
            while True:
                kind, value = items.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            stop.set()

    return consume()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
