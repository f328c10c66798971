"""Document sources: C4 on the hub or a local directory in C4's layout, read by one code path.

Both are streamed with the `datasets` JSON loader (JSON lines with ``text``, ``timestamp``, ``url``):
the hub through ``hf://`` data_files patterns at a pinned revision (no full download), a local
directory through its file list. Without network a hub source fails at once with one clear line
instead of `datasets`' ~25 s of retries and a bare ConnectionError.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from tiny_llm.errors import DataError

Split = Literal["train", "validation"]
SPLITS: tuple[Split, ...] = ("train", "validation")
HUB_SUBDIR = "en"
PROBE_TIMEOUT_S = 1.5
_TRUE = {"1", "on", "yes", "true"}


def hub_offline() -> bool:
    """True when the user switched the hub off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."""
    return any(
        os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Open one TCP connection to the hub endpoint; DNS included, bounded by ``timeout`` seconds."""
    url = urlparse(_hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((url.hostname or "", port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    # getaddrinfo ignores socket timeouts, so the probe runs in a thread we stop waiting for.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def require_hub(what: str) -> None:
    """Fail fast, in one line, when ``what`` needs the hub and the hub cannot be used."""
    hint = (
        "use local files instead (a C4-format directory as data.dataset, a tokenizer path as data.tokenizer)"
    )
    if hub_offline():
        raise DataError(
            f"{what} needs the Hugging Face hub but HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set; {hint}"
        )
    if not hub_reachable():
        raise DataError(f"{what} needs the Hugging Face hub, which is not reachable from here; {hint}")


@dataclass(frozen=True)
class CorpusSource:
    """Where documents come from: a hub dataset at a revision, or a local C4-format directory."""

    dataset: str
    revision: str | None
    local_dir: Path | None

    @property
    def is_local(self) -> bool:
        return self.local_dir is not None

    def check_available(self) -> None:
        """Fail before any work: local files of both splits exist, or the hub is usable."""
        for split in SPLITS:
            self.data_files(split)
        if not self.is_local:
            require_hub(f"dataset {self.dataset}")

    def data_files(self, split: Split) -> list[str]:
        """The files (local) or the hf:// pattern (hub) of one split."""
        pattern = f"c4-{split}.*.json.gz"
        if self.local_dir is None:
            at = f"@{self.revision}" if self.revision else ""
            return [f"hf://datasets/{self.dataset}{at}/{HUB_SUBDIR}/{pattern}"]
        files = sorted(str(p) for p in self.local_dir.glob(pattern) if p.is_file())
        if not files:
            raise DataError(
                f"dataset {self.dataset}: no {split} files ({pattern}); a C4-format directory needs both "
                "c4-train.*.json.gz and c4-validation.*.json.gz"
            )
        return files

    def iter_texts(
        self, split: Split, batch_size: int, shuffle_seed: int | None = None, shuffle_buffer: int = 0
    ) -> Iterator[list[str]]:
        """Batches of document texts; train may be shuffled (seeded streaming shuffle buffer)."""
        files = self.data_files(split)
        if not self.is_local:
            require_hub(f"dataset {self.dataset}")
        try:  # load_dataset already reads the first file to infer its columns
            stream = _open_stream(files, self.dataset, split)
            if shuffle_seed is not None and shuffle_buffer > 1:
                stream = stream.shuffle(seed=shuffle_seed, buffer_size=shuffle_buffer)
            iterator = iter(stream.select_columns(["text"]).iter(batch_size=batch_size))
        except DataError:
            raise
        except Exception as exc:
            raise self._read_error(split, files, exc) from None
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except Exception as exc:  # datasets/pyarrow/gzip raise many types for one bad file
                raise self._read_error(split, files, exc) from None
            yield _texts(batch, self.dataset, split)

    def _read_error(self, split: Split, files: list[str], exc: BaseException) -> DataError:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if self.is_local:
            bad = find_bad_file(files)
            if bad:
                return DataError(bad)
        return DataError(f"dataset {self.dataset}: cannot read the {split} split ({detail[:300]})")


def _open_stream(files: list[str], dataset: str, split: Split):  # -> datasets.IterableDataset
    import datasets

    datasets.disable_progress_bars()
    # No download-count ping per load_dataset call: it can stall up to 3 s where outbound traffic is dropped.
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    try:
        return datasets.load_dataset("json", data_files={split: files}, split=split, streaming=True)
    except FileNotFoundError as exc:
        raise DataError(f"dataset {dataset}: no {split} files found ({str(exc).splitlines()[0]})") from None


def _texts(batch: dict[str, list], dataset: str, split: Split) -> list[str]:
    texts = batch.get("text")
    if texts is None or any(not isinstance(t, str) for t in texts):
        raise DataError(
            f"dataset {dataset}: a {split} document has no 'text' string (C4 JSON lines need 'text')"
        )
    return texts


def find_bad_file(files: list[str]) -> str | None:
    """Name the first unreadable file and why (only called after a read failed)."""
    for file in files:
        try:
            problem = _file_problem(file)
        except (OSError, EOFError, zlib.error) as exc:
            return f"{file}: corrupt or truncated gzip ({exc}); re-create or remove the file"
        if problem:
            return f"{file}: {problem}"
    return None


def _file_problem(file: str) -> str | None:
    """What is wrong with one C4 JSON-lines file, read line by line (None: nothing found)."""
    documents = 0
    with gzip.open(file, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte, column = raw[exc.start], exc.start + 1
                return (
                    f"line {number} is not UTF-8 text (byte 0x{byte:02x} at column {column}); C4 JSON lines "
                    "are UTF-8: convert the file (iconv -f latin1 -t utf-8, say) and compress it again"
                )
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"line {number} is not JSON ({exc.msg}); re-create or remove the file"
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                return f"line {number} has no 'text' string (C4 JSON lines need 'text')"
            documents += 1
    if not documents:
        return "holds no documents (an empty file); remove it, or write its documents into it"
    return None


def is_local_dataset(dataset: str) -> bool:
    """A path on disk (existing, or spelled like a path) rather than a hub id ("owner/name")."""
    return (
        Path(dataset).expanduser().exists()
        or dataset.startswith(("/", "./", "../", "~"))
        or dataset.count("/") != 1
    )


def resolve_source(dataset: str, revision: str | None) -> CorpusSource:
    """A local directory when ``dataset`` names one on disk (or is spelled like a path), else a hub id."""
    path = Path(dataset).expanduser()
    if is_local_dataset(dataset):
        if not path.is_dir():
            raise DataError(f"dataset directory not found: {dataset} (data.dataset)")
        if (path / HUB_SUBDIR).is_dir() and not any(path.glob("c4-*.json.gz")):
            path = path / HUB_SUBDIR
        if not any(path.glob("c4-*.json.gz")):
            raise DataError(f"dataset directory {dataset} holds no c4-train/validation.*.json.gz files")
        return CorpusSource(dataset=dataset, revision=None, local_dir=path)
    return CorpusSource(dataset=dataset, revision=revision, local_dir=None)
