"""Atomic file writes and exclusive directory locks.

Every file another step reads is written to a temporary sibling, fsynced and
renamed into place, so a reader sees either the old or the new content.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from tiny_llm.errors import RunStateError

_UMASK = os.umask(0)
os.umask(_UMASK)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(handle)`` on a temp sibling of ``path``, fsync it and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via temp file + fsync + rename."""
    atomic_write_with(path, lambda handle: handle.write(data))


@contextlib.contextmanager
def replacing_directory(output: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp sibling of ``output`` to fill; on success it replaces ``output``, else it is removed."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield tmp
        tmp.chmod(0o777 & ~_UMASK)  # mkdtemp makes it private
        if output.exists():
            shutil.rmtree(output)
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(output.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def canonical_json(obj: Any) -> str:
    """Deterministic JSON used for identities (sorted keys, no whitespace)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def atomic_write_yaml(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def append_jsonl(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append one JSON line and fsync it, so a crash loses at most the line being written."""
    line = json.dumps(row, allow_nan=False) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def exclusive_lock(lock_path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock on ``lock_path`` or fail at once.

    The kernel drops the lock when the process dies (even by SIGKILL), so a
    stale lock file never blocks a rerun.
    """
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunStateError(
                f"{what} is in use by another process (lock {lock_path}); wait for it or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
