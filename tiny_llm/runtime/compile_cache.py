"""Where Inductor and Triton keep compiled kernels: a private directory, never the shared temp default.

Inductor's default, ``<tmp>/torchinductor_<user>``, is a name any other user of the host can create first (and
fill with code that this process would then load). ``setup_compile_cache`` (called by ``setup_runtime``,
before anything compiles) points ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` at a directory that this
user owns and no one else may write, checked by ``tiny_llm.io.private_directory`` (never through a symbolic
link):

- ``$TINY_LLM_COMPILE_CACHE/tiny-llm-compile-<uid>`` when the variable is set (the workflow sets it to its
  ``compile_cache``, one directory under its results/, so that its jobs share the cache and only the first
  compiles from cold). The directory named is created when missing and never changed: it may be a shared
  one (a sticky /tmp, a setgid project directory). One that every user may write without the sticky bit is
  refused, as is a cache directory in it that is another user's or that others may write.
- else ``<tmp>/tiny-llm-compile-<uid>``, created 0700 (narrowed to 0700 when it is ours but open).

A ``TORCHINDUCTOR_CACHE_DIR`` the user set is kept unless ``TINY_LLM_COMPILE_CACHE`` is set as well.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from tiny_llm.errors import ConfigError
from tiny_llm.io import private_directory

ENV = "TINY_LLM_COMPILE_CACHE"
# The directory this process set, so that a second setup does not take it for the user's choice.
_applied: list[str] = []


def cache_name() -> str:
    """The cache directory's name, in the temp directory or in the one ``TINY_LLM_COMPILE_CACHE`` names."""
    return f"tiny-llm-compile-{os.getuid()}"


def default_compile_cache() -> Path:
    return Path(tempfile.gettempdir()) / cache_name()


def compile_cache_directory(explicit: str | None) -> Path:
    """The private cache directory for ``TINY_LLM_COMPILE_CACHE``'s value (``None``: the default), created
    when missing; ConfigError in one line naming the setting when it cannot be used."""
    if not explicit:
        default, advice = default_compile_cache(), f"set {ENV} to a directory of yours"
        try:
            default.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"compile cache {default}: {exc.strerror}; {advice}") from None
        return _private(default, narrow=True, advice=advice)
    advice = f"point {ENV} (the workflow's compile_cache) at another directory"
    given = Path(explicit).absolute()
    try:
        given.mkdir(parents=True, exist_ok=True)
        info = given.stat()
    except OSError as exc:
        raise ConfigError(f"{ENV} {given}: {exc.strerror}; {advice}") from None
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise ConfigError(
            f"{ENV} {given}: every user may write it and it has no sticky bit (mode "
            f"{stat.S_IMODE(info.st_mode):04o}), so anyone could replace the compile cache in it; {advice}"
        )
    return _private(given / cache_name(), narrow=False, advice=advice)


def _private(path: Path, *, narrow: bool, advice: str) -> Path:
    try:
        return private_directory(path, narrow=narrow)
    except OSError as exc:
        reason = exc.strerror
        if exc.errno == errno.EPERM:
            with contextlib.suppress(OSError):
                reason = f"belongs to another user (uid {os.lstat(path).st_uid})"
        raise ConfigError(f"compile cache {path}: {reason}; {advice}") from None


def setup_compile_cache() -> Path | None:
    """Set the compile caches' environment; return the directory, or None when the user's own
    TORCHINDUCTOR_CACHE_DIR is kept."""
    explicit = os.environ.get(ENV)
    if not explicit and os.environ.get("TORCHINDUCTOR_CACHE_DIR") and not _set_by_us():
        return None
    directory = compile_cache_directory(explicit)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    os.environ["TRITON_CACHE_DIR"] = str(directory / "triton")
    _applied[:] = [str(directory)]
    return directory


def _set_by_us() -> bool:
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") in _applied
