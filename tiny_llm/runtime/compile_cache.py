"""Where Inductor and Triton keep compiled kernels: a private directory, never the shared temp default.

Inductor's default, ``<tmp>/torchinductor_<user>``, is a name any other user of the host can create first (and
fill with code that this process would then load). ``setup_compile_cache`` (called by ``setup_runtime``,
before anything compiles) points ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` at a directory that this
user owns and no one else may write, checked by ``tiny_llm.io.private_directory`` (never through a symbolic
link):

- ``$TINY_LLM_COMPILE_CACHE/tiny-llm-compile-<uid>`` when the variable is set (``~`` expanded; the
  workflow sets it to its ``compile_cache``, one directory under its results/, so that its jobs share the
  cache and only the first compiles from cold). The directory named is created when missing (without group
  or other write access) and never changed: it may be a shared one (a sticky /tmp). A cache directory in it
  that is another user's or that others may write is refused.
- else ``<tmp>/tiny-llm-compile-<uid>``, created 0700 (narrowed to 0700 when it is ours but open).

Either way the directory holding the cache, and every directory above it, must be one that only this user and
root can rename entries of (``tiny_llm.io.renamable_by_others``): a group-writable project directory without
the sticky bit (a setgid 2775 one) would let a group member rename the checked cache away and put their own
kernels in its place, which Inductor would then load. Such a place is refused in one line.

A ``TORCHINDUCTOR_CACHE_DIR`` the user set is kept unless ``TINY_LLM_COMPILE_CACHE`` is set as well.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from tiny_llm.errors import ConfigError
from tiny_llm.io import private_directory, renamable_by_others

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
        _refuse_renamable(default.parent, f"compile cache {default}", advice)
        return _private(default, narrow=True, advice=advice)
    advice = f"point {ENV} (the workflow's compile_cache) at another directory"
    given = Path(explicit).expanduser().absolute()
    try:
        given.mkdir(mode=0o755, parents=True, exist_ok=True)  # no group write, whatever the umask
    except OSError as exc:
        raise ConfigError(f"{ENV} {given}: {exc.strerror}; {advice}") from None
    _refuse_renamable(given, f"{ENV} {given}", advice)
    return _private(given / cache_name(), narrow=False, advice=advice)


def _refuse_renamable(directory: Path, what: str, advice: str) -> None:
    """One line when someone else could swap the cache directory that ``directory`` holds."""
    reason = renamable_by_others(directory)
    if reason is not None:
        raise ConfigError(
            f"{what}: {reason}, so another user could replace the compile cache there with kernels of "
            f"theirs; {advice}, one only you (and root) can write, or add the sticky bit (chmod +t)"
        )


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
