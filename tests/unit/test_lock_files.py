"""Lock files on a shared host: never followed through a symlink, never truncated unless ours alone, and the
GPU slots in a private directory of this user's."""

from __future__ import annotations

import os
import stat
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
