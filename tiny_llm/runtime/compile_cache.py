"""Where Inductor and Triton keep compiled kernels: a private directory, never the shared temp default.

Inductor's default, ``<tmp>/torchinductor_<user>``, is a name any other user of the host can create first (and
fill with code that this process would then load). ``setup_compile_cache`` (called by ``setup_runtime``,
before anything compiles) points ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` at a directory that this
user owns with mode 0700: ``$TINY_LLM_COMPILE_CACHE`` when set (the workflow sets it to one cache under its
results/, shared by its jobs so that only the first compiles from cold), else
``<tmp>/tiny-llm-compile-<uid>``.
A ``TORCHINDUCTOR_CACHE_DIR`` the user set is kept unless ``TINY_LLM_COMPILE_CACHE`` is set as well.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tiny_llm.errors import ConfigError

ENV = "TINY_LLM_COMPILE_CACHE"
# The directory this process set, so that a second setup does not take it for the user's choice.
_applied: list[str] = []


def default_compile_cache() -> Path:
    return Path(tempfile.gettempdir()) / f"tiny-llm-compile-{os.getuid()}"


def private_directory(path: Path) -> Path:
    """``path`` (created with mode 0700 if missing) after checking this user owns it; wider modes narrowed."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError as exc:
        raise ConfigError(
            f"compile cache {path}: {exc.strerror}; set {ENV} to a writable directory"
        ) from None
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"compile cache {path} belongs to another user (uid {info.st_uid}); "
            f"set {ENV} to a directory of yours"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def setup_compile_cache() -> Path | None:
    """Set the compile caches' environment; return the directory, or None when the user's own
    TORCHINDUCTOR_CACHE_DIR is kept."""
    explicit = os.environ.get(ENV)
    if not explicit and os.environ.get("TORCHINDUCTOR_CACHE_DIR") and not _set_by_us():
        return None
    directory = private_directory(Path(explicit).absolute() if explicit else default_compile_cache())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    os.environ["TRITON_CACHE_DIR"] = str(directory / "triton")
    _applied[:] = [str(directory)]
    return directory


def _set_by_us() -> bool:
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") in _applied
