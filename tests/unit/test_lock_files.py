"""Lock files on a shared host: never followed through a symlink, never truncated unless ours alone, and the
GPU slots in a private directory of this user's."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny_llm.errors import RunStateError
from tiny_llm.io import exclusive_lock
from tiny_llm.runtime import device as device_module


@pytest.fixture
def release_gpu_locks():
    held = len(device_module._GPU_LOCKS)
    yield
    for fd in device_module._GPU_LOCKS[held:]:
        os.close(fd)
    del device_module._GPU_LOCKS[held:]


def victim_file(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "thesis.tex"
    victim.parent.mkdir()
    victim.write_text("years of work")
    return victim


def test_exclusive_lock_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    victim = victim_file(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").symlink_to(victim)
    with (
        pytest.raises(RunStateError, match="lock .* is a symbolic link"),
        exclusive_lock(run_dir / ".lock", "run directory"),
    ):
        pass
    assert victim.read_text() == "years of work"


def test_exclusive_lock_never_truncates_a_file_linked_elsewhere(tmp_path: Path) -> None:
    victim = victim_file(tmp_path)
    (tmp_path / "run").mkdir()
    os.link(victim, tmp_path / "run" / ".lock")
    with exclusive_lock(tmp_path / "run" / ".lock", "run directory"):
        pass
    assert victim.read_text() == "years of work"


def test_a_gpu_lock_symlink_is_refused_and_its_target_kept(tmp_path: Path, release_gpu_locks) -> None:
    victim = victim_file(tmp_path)
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    (locks / "gpu-0.lock").symlink_to(victim)
    with pytest.raises(device_module.GpuLocksUnavailable):
        device_module.claim_first_free([locks / "gpu-0.lock"])
    assert victim.read_text() == "years of work"


def test_gpu_locks_live_in_a_private_directory_under_xdg_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_gpu_locks
) -> None:
    monkeypatch.delenv("TINY_LLM_GPU_LOCK_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    locks = device_module.gpu_lock_dir()
    assert locks.parent == tmp_path
    assert device_module.claim_first_free([locks / "gpu-0.lock"]) == 0
    assert stat.S_IMODE(os.lstat(locks).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(locks / "gpu-0.lock").st_mode) == 0o600


def test_a_lock_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_gpu_locks
) -> None:
    monkeypatch.delenv("TINY_LLM_GPU_LOCK_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    locks = device_module.gpu_lock_dir()
    locks.mkdir(mode=0o700)
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 1)  # the directory now belongs to someone else
    with pytest.raises(device_module.GpuLocksUnavailable, match="not owned by you"):
        device_module.claim_first_free([device_module.gpu_lock_dir() / "gpu-0.lock"])
    assert not (locks / "gpu-0.lock").exists()


def test_a_predictable_lock_directory_planted_as_a_symlink_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_gpu_locks
) -> None:
    monkeypatch.delenv("TINY_LLM_GPU_LOCK_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(device_module.tempfile, "gettempdir", lambda: str(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    device_module.gpu_lock_dir().symlink_to(elsewhere)
    with pytest.raises(device_module.GpuLocksUnavailable, match="symbolic link"):
        device_module.claim_first_free([device_module.gpu_lock_dir() / "gpu-0.lock"])
    assert list(elsewhere.iterdir()) == []


def refuse_write_opens(monkeypatch: pytest.MonkeyPatch, lock: Path, *, reads: bool = True) -> None:
    """``lock`` behaves as another user's 0644 lock file (0600 when ``reads`` is false), whatever our uid."""
    real_open = os.open

    def as_a_colleague(path, flags, *args):  # noqa: ANN001, ANN202
        if Path(path) == lock and (flags & (os.O_WRONLY | os.O_RDWR) or not reads):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", as_a_colleague)


def test_a_colleagues_lock_file_is_locked_read_only_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared token cache's lock, created 0644 by the colleague who prepared first: flock needs no write."""
    lock = tmp_path / "cache.lock"
    lock.write_text("their-host 123\n")
    lock.chmod(0o644)
    refuse_write_opens(monkeypatch, lock)
    with (
        exclusive_lock(lock, "token cache x"),
        pytest.raises(RunStateError, match=r"^token cache x is in use by another process"),
        exclusive_lock(lock, "token cache x"),
    ):
        pass
    assert lock.read_text() == "their-host 123\n" and stat.S_IMODE(lock.stat().st_mode) == 0o644


def test_a_lock_file_that_cannot_be_opened_at_all_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "cache.lock"
    lock.write_text("their-host 123\n")
    lock.chmod(0o600)
    refuse_write_opens(monkeypatch, lock, reads=False)
    with pytest.raises(RunStateError) as err, exclusive_lock(lock, "token cache x"):
        pass
    assert str(err.value) == (
        f"token cache x: cannot open its lock {lock} (Permission denied); its owner can make it readable "
        "to you (chmod a+r), or remove it, and rerun"
    )
    assert lock.read_text() == "their-host 123\n" and stat.S_IMODE(lock.stat().st_mode) == 0o600


def test_a_read_only_lock_on_a_filesystem_that_needs_write_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS emulates flock with byte-range locks, which refuse a read-only fd (EBADF)."""
    import errno
    import fcntl

    lock = tmp_path / "cache.lock"
    lock.write_text("")
    refuse_write_opens(monkeypatch, lock)

    def byte_range_lock(fd: int, op: int) -> None:
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(fcntl, "flock", byte_range_lock)
    with pytest.raises(RunStateError) as err, exclusive_lock(lock, "token cache x"):
        pass
    assert str(err.value) == (
        f"token cache x: cannot lock {lock} read-only on its filesystem; its owner can make it writable to "
        "you (chmod a+w), or remove it, and rerun"
    )


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path lies under a private one)."""
    directory = Path(tempfile.mkdtemp(prefix="tiny-llm-shared-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory)


@pytest.mark.skipif(os.getuid() != 0, reason="a lock file of another user needs root to make")
def test_a_lock_file_of_another_user_is_taken_read_only(shared_dir: Path) -> None:
    """As a second user (forked, uid 4242): the first user's 0644 lock in a shared directory."""
    lock = shared_dir / "cache.lock"
    with exclusive_lock(lock, "token cache x"):
        pass
    assert stat.S_IMODE(lock.stat().st_mode) == 0o644 & ~current_umask()
    before = lock.read_bytes()
    pid = os.fork()
    if pid == 0:  # the colleague
        code = 1
        try:
            os.setgid(4242)
            os.setuid(4242)
            with exclusive_lock(lock, "token cache x"):
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock.read_bytes() == before and lock.stat().st_uid == 0


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_lock_that_cannot_be_created_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared cache's directory this user may not write, with no lock file in it yet."""
    lock = tmp_path / "shared" / "cache.lock"
    lock.parent.mkdir()
    refuse_write_opens(monkeypatch, lock)
    with pytest.raises(RunStateError) as err, exclusive_lock(lock, "token cache x"):
        pass
    assert str(err.value) == (
        f"token cache x: cannot create its lock {lock} (Permission denied); make {lock.parent} writable to "
        "you, or choose another location, and rerun"
    )
    assert list(lock.parent.iterdir()) == []
