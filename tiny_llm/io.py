"""File primitives: atomic writes, JSON/YAML reads that name a damaged file, JSONL appends, exclusive locks
and the checks of private and shared directories.

Every file another step reads is written to a temporary sibling, fsynced and
renamed into place, so a reader sees either the old or the new content. The policy of the directories a
command writes (the output marker) is ``tiny_llm.output_dirs``'.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from tiny_llm.errors import DamagedFileError, DiskFullError, RunStateError

UMASK = os.umask(0)
"""The process's umask (read once: setting it is the only way to read it)."""
os.umask(UMASK)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an error it was raised from (torch wraps its writer's OSError) is a full disk."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(path: str | os.PathLike[str], kept: str) -> DiskFullError:
    """The one-line error for a write to ``path`` that ran out of space; ``kept`` says what is intact."""
    path = Path(path)
    return DiskFullError(
        f"disk full: no space left on the device holding {path.parent} while writing {path.name}; {kept}; "
        "free space there and rerun the same command"
    )


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(handle)`` on a temp sibling of ``path``, fsync it and rename it into place.

    A full disk leaves ``path`` as it was and raises DiskFullError naming it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~UMASK)  # mkstemp makes 0600; give the usual permissions
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if is_disk_full(exc) and not isinstance(exc, DiskFullError):
            kept = f"the previous {path.name} is unchanged" if existed else "nothing was written"
            raise disk_full_error(path, kept) from exc
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via temp file + fsync + rename."""

    def write(handle: BinaryIO) -> None:
        handle.write(data)

    atomic_write_with(path, write)


_ATOMIC_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def is_atomic_temp(name: str) -> bool:
    """Whether ``name`` is the temp file of an atomic write (``.<file>.<8 characters>.tmp``, as
    atomic_write_with's mkstemp names it): what a writer killed mid-write leaves behind, and nothing else."""
    return _ATOMIC_TEMP.fullmatch(name) is not None


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def canonical_json(obj: Any) -> str:
    """Deterministic JSON used for identities (sorted keys, no whitespace)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def atomic_write_yaml(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(obj, sort_keys=False))


REPLACED_INFIX = ".replaced-"
"""A run directory whose recipe changed is kept as the sibling ``<run>.replaced-N``; reports skip it."""


def is_replaced_run(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (a run directory) is one set aside as ``<run>.replaced-N``."""
    head, sep, tail = Path(path).name.rpartition(REPLACED_INFIX)
    return bool(head and sep and tail.isdigit())


REBUILD_HINT = "delete it and rerun the command that wrote it"


def damaged_message(path: str | os.PathLike[str], reason: str, rebuild: str | None = None) -> str:
    """``<path> is damaged (<reason>); <how to rebuild it>`` on one line."""
    reason = " ".join(str(reason).split())
    return f"{path} is damaged ({reason[:160]}); {rebuild or REBUILD_HINT}"


# Python reads no integer of more digits than this (a guard against slow parsing); a longer one in a YAML or
# JSON file is a ValueError that names nothing: parse_yaml and parse_json name where it is.
_LONG_INTEGER = re.compile(rf"[-+]?[0-9][0-9_]{{{sys.get_int_max_str_digits() or 10**9},}}")


def _is_integer_limit(exc: ValueError) -> bool:
    return "integer string conversion" in str(exc)


class LongIntegerError(yaml.YAMLError):
    """A YAML document holding an integer longer than Python reads (its message names the key and line)."""


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``; an integer too long for Python to read is a LongIntegerError naming its
    key and line (read from the document's nodes, which hold the digits as text), not a bare ValueError."""
    try:
        return yaml.safe_load(text)
    except ValueError as exc:
        if not _is_integer_limit(exc):
            raise
        key, line = _long_integer_node(yaml.compose(text), "")
        raise LongIntegerError(
            f"{key or '(top level)'}: an integer of more than {sys.get_int_max_str_digits():,} digits "
            f"(line {line}); no setting takes one"
        ) from None


def _long_integer_node(node: Any, key: str) -> tuple[str, int]:
    """The dotted key and line of the first scalar spelling an integer longer than Python reads."""
    if isinstance(node, yaml.ScalarNode) and _LONG_INTEGER.fullmatch(node.value or ""):
        return key, node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        children = [(f"{key}.{k.value}" if key else str(k.value), v) for k, v in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = [(f"{key}[{i}]", v) for i, v in enumerate(node.value)]
    else:
        return "", 0
    for child_key, child in children:
        found = _long_integer_node(child, child_key)
        if found[1]:
            return found
    return "", 0


def parse_json(text: str) -> Any:
    """``json.loads(text)``; an integer too long for Python to read is a ``json.JSONDecodeError`` at its
    place, not a bare ValueError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        if not _is_integer_limit(exc):
            raise
        found = _LONG_INTEGER.search(text)
        where = found.start() if found else 0
        limit = sys.get_int_max_str_digits()
        raise json.JSONDecodeError(f"an integer of more than {limit:,} digits", text, where) from None


def read_json(path: str | os.PathLike[str], rebuild: str | None = None) -> Any:
    """Parse a JSON file; a damaged one (torn, altered, not JSON) raises DamagedFileError naming it and
    ``rebuild``, the way to make it again (default: delete it and rerun the command that wrote it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_json(handle.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedFileError(damaged_message(path, f"not valid JSON: {exc}", rebuild)) from None


def read_json_mapping(path: str | os.PathLike[str], rebuild: str | None = None) -> dict[str, Any]:
    """read_json of a file that must hold a JSON object."""
    data = read_json(path, rebuild)
    if not isinstance(data, dict):
        raise DamagedFileError(
            damaged_message(path, f"a JSON object expected, found {type(data).__name__}", rebuild)
        )
    return data


def read_yaml(path: str | os.PathLike[str], rebuild: str | None = None) -> Any:
    """Parse a YAML file; a damaged one raises DamagedFileError like read_json."""
    text = Path(path).read_bytes()
    try:
        return parse_yaml(text.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DamagedFileError(damaged_message(path, f"not valid YAML: {what}{where}", rebuild)) from None


def append_jsonl(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append one JSON line and fsync it, so a crash loses at most the line being written (a reader skips a
    torn last line; a resumed run rewrites it). A full disk raises DiskFullError naming the file."""
    line = json.dumps(row, allow_nan=False) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(path, "its earlier lines are unchanged") from exc
        raise


def private_directory(path: str | os.PathLike[str], *, narrow: bool = True) -> Path:
    """``path`` as a directory only this user can use: created 0700 when missing; OSError when it is a
    symbolic link, not a directory, or another user's (a planted directory in a shared /tmp).

    It is opened without following a link and checked and changed through that descriptor, so a link put in
    its place after the check is never followed. ``narrow``: an existing one that others may use is narrowed
    to 0700 (a directory named for this user alone); without it, one that others may write is refused
    (OSError EACCES) and no mode is ever changed."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            raise OSError(errno.ELOOP, "is a symbolic link", str(path)) from None
        raise OSError(errno.ENOTDIR, "is not a directory", str(path)) from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise OSError(errno.EPERM, "not owned by you", str(path))
        if narrow and stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o700)  # ours, named for us alone, but open to others: close it
        elif not narrow and stat.S_IMODE(info.st_mode) & 0o022:
            mode = stat.S_IMODE(info.st_mode)
            raise OSError(errno.EACCES, f"writable by others (mode {mode:04o})", str(path))
    finally:
        os.close(fd)
    return path


def renamable_by_others(path: str | os.PathLike[str]) -> str | None:
    """Why another user could rename what ``path`` holds, through it or a directory above it; None when only
    this user and root can (``ssh``'s StrictModes rule, with the sticky bit honoured).

    A directory someone else may write without the sticky bit lets them rename an entry away after it was
    checked and put their own in its place; its owner can do so whatever its mode. Checked along the path as
    written and as resolved, so a link on the way counts too. A group of this user's alone (a user private
    group: named as the user, no other members) is not someone else."""
    written = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    for directory in dict.fromkeys([written, *written.parents, real, *real.parents]):
        try:
            info = os.stat(directory)
        except OSError as exc:
            return f"{directory} cannot be checked ({exc.strerror})"
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (0, os.getuid()):
            return f"{directory} belongs to another user (uid {info.st_uid}), who may rename what it holds"
        if mode & stat.S_ISVTX:
            continue
        if mode & stat.S_IWOTH:
            return f"{directory} may be written by every user and has no sticky bit (mode {mode:04o})"
        if mode & stat.S_IWGRP and not group_is_yours_alone(info.st_gid):
            return (
                f"{directory} may be written by group {group_name(info.st_gid)} and has no sticky bit "
                f"(mode {mode:04o})"
            )
    return None


def group_is_yours_alone(gid: int) -> bool:
    """Whether group ``gid`` is this user's private group: the primary group, named as the user, with no
    other members listed (the user-private-group convention of Debian, Ubuntu and Red Hat)."""
    import grp
    import pwd

    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.getuid())
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def group_name(gid: int) -> str:
    import grp

    try:
        return f"'{grp.getgrgid(gid).gr_name}'"
    except KeyError:
        return str(gid)


def open_lock_file(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """An fd to flock the lock file ``path`` with (created if missing), never through a symbolic link (OSError
    ELOOP) and never on anything but a regular file (OSError EINVAL): read-write, else read-only where
    writing is refused (another user's lock file; flock needs no write access). OSError when neither opens."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, mode)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        try:
            fd = os.open(path, os.O_RDONLY | flags)
        except OSError:
            raise exc from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "is not a regular file", str(path))
    return fd


def note_lock_holder(fd: int) -> None:
    """Write our host and PID into a held lock file, for people, only when the file is this user's alone (one
    link) and open for writing: a lock file linked to someone's data is never truncated."""
    info = os.fstat(fd)
    writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
    if writable and stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and info.st_nlink == 1:
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())  # who holds it, for a human


@contextlib.contextmanager
def exclusive_lock(lock_path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock on ``lock_path`` or fail at once.

    The kernel drops the lock when the process dies (even by SIGKILL), so a
    stale lock file never blocks a rerun. A symbolic link in its place is refused, not followed.
    """
    fd = acquire_lock(lock_path, what)
    try:
        yield
    finally:
        os.close(fd)


def acquire_lock(lock_path: str | os.PathLike[str], what: str, busy: str | None = None) -> int:
    """The fd holding an exclusive, non-blocking flock on ``lock_path`` (closing it releases the lock), or a
    one-line RunStateError: ``busy`` when another process holds it (default: ``what`` is in use)."""
    lock_path = Path(lock_path)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(lock_path)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EINVAL):
            reason = "a symbolic link" if exc.errno == errno.ELOOP else "not a regular file"
            raise RunStateError(f"{what}: its lock {lock_path} is {reason}; remove it and rerun") from None
        if os.path.lexists(lock_path):
            raise RunStateError(
                f"{what}: cannot open its lock {lock_path} ({exc.strerror}); its owner can make it readable "
                "to you (chmod a+r), or remove it, and rerun"
            ) from None
        raise RunStateError(
            f"{what}: cannot create its lock {lock_path} ({exc.strerror}); make {lock_path.parent} writable "
            "to you, or choose another location, and rerun"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunStateError(
            busy or f"{what} is in use by another process (lock {lock_path}); wait for it or stop it first"
        ) from None
    except OSError as exc:  # e.g. NFSv3 with no lock manager (ENOLCK), Lustre mounted noflock (ENOSYS)
        os.close(fd)
        if exc.errno == errno.EBADF:  # NFS locks by byte ranges, which a read-only fd cannot lock
            raise RunStateError(
                f"{what}: cannot lock {lock_path} read-only on its filesystem; its owner can make it "
                "writable to you (chmod a+w), or remove it, and rerun"
            ) from None
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        raise RunStateError(
            f"cannot lock {lock_path} ({exc.strerror}): its filesystem does not support flock; "
            "put it on storage with working locks (README, 'Shared storage')"
        ) from None
    try:
        note_lock_holder(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd
