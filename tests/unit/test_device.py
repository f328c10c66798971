"""GPU slot locks and matmul precision, with the CUDA queries monkeypatched (no GPU needed)."""

from __future__ import annotations

import fcntl
import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError, RunStateError
from tiny_llm.runtime import device as device_module
from tiny_llm.train.launch import visible_gpus


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[callable]:
    """``gpus(n)`` makes n GPUs visible (uuids GPU-0...) with locks under tmp_path; locks released after."""
    monkeypatch.setenv("TINY_LLM_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"GPU-{i}"))
    held = len(device_module._GPU_LOCKS)

    def visible(count: int) -> Path:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        return tmp_path / "locks"

    yield visible
    for fd in device_module._GPU_LOCKS[held:]:
        os.close(fd)
    del device_module._GPU_LOCKS[held:]
    device_module._HELD_GPU_LOCKS.clear()


def locked_elsewhere(path: Path) -> bool:
    """True when another open file holds ``path``'s flock (what another process would find)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def hold(path: Path) -> int:
    """Take ``path``'s lock as another tiny-llm process would (caller closes the fd)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_one_visible_gpu_is_locked_too(gpus) -> None:
    """Local jobs on a one-GPU machine (or Slurm jobs on one node) must not share it unknowingly."""
    locks = gpus(1)
    assert device_module.select_device("auto") == torch.device("cuda:0")
    assert locked_elsewhere(locks / "gpu-GPU-0.lock")
    assert device_module.select_device("auto") == torch.device("cuda:0")  # this process's own slot


def test_the_only_gpu_taken_by_another_process_is_refused(gpus) -> None:
    locks = gpus(1)
    fd = hold(locks / "gpu-GPU-0.lock")
    try:
        with pytest.raises(RunStateError, match="all 1 visible GPUs are taken by other tiny-llm processes"):
            device_module.select_device("auto")
    finally:
        os.close(fd)


def test_explicit_gpu_takes_its_slot_so_auto_jobs_keep_off(gpus, capsys) -> None:
    locks = gpus(2)
    assert device_module.select_device("cuda:1") == torch.device("cuda:1")
    assert locked_elsewhere(locks / "gpu-GPU-1.lock")
    assert not (locks / "gpu-GPU-0.lock").exists()
    assert capsys.readouterr().err == ""


def test_explicit_gpu_in_use_elsewhere_is_shared_with_a_warning(gpus, capsys) -> None:
    locks = gpus(2)
    fd = hold(locks / "gpu-GPU-0.lock")
    try:
        assert device_module.select_device("cuda:0") == torch.device("cuda:0")
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cuda:0 is in use by another tiny-llm process" in err


def test_auto_skips_a_gpu_another_process_holds(gpus) -> None:
    locks = gpus(2)
    fd = hold(locks / "gpu-GPU-0.lock")
    try:
        assert device_module.select_device("auto") == torch.device("cuda:1")
    finally:
        os.close(fd)


def test_a_missing_shared_lock_directory_is_made_for_every_user_with_the_sticky_bit(gpus) -> None:
    """TINY_LLM_GPU_LOCK_DIR coordinates users: each may add a lock file there, and none remove another's."""
    locks = gpus(1)
    umask = os.umask(0o077)
    try:
        assert device_module.select_device("auto") == torch.device("cuda:0")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777 and (locks / "gpu-GPU-0.lock").is_file()


def test_an_existing_shared_lock_directory_keeps_its_mode(gpus) -> None:
    locks = gpus(1)
    locks.mkdir(mode=0o2770)
    locks.chmod(0o2770)
    assert device_module.select_device("auto") == torch.device("cuda:0")
    assert stat.S_IMODE(locks.stat().st_mode) == 0o2770


def test_a_launcher_takes_k_free_slots_and_its_ranks_take_none(gpus, monkeypatch, capsys) -> None:
    """A 2-rank job on a 4-GPU machine whose GPUs 0 and 2 another job holds trains on 1 and 3 (not on
    cuda:0 and cuda:1 whatever the locks say), named to its ranks by CUDA_VISIBLE_DEVICES; a rank's explicit
    cuda:r then takes no lock of its own (its launcher holds it), with no warning."""
    locks = gpus(4)
    others = [hold(locks / "gpu-GPU-0.lock"), hold(locks / "gpu-GPU-2.lock")]
    try:
        assert device_module.claim_gpu_slots(2) == [1, 3]
        assert locked_elsewhere(locks / "gpu-GPU-1.lock") and locked_elsewhere(locks / "gpu-GPU-3.lock")
        assert visible_gpus([1, 3], {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["5", "7"]
        with pytest.raises(ConfigError, match="runtime.num_gpus: 5 ranks but only 4 GPU"):
            device_module.claim_gpu_slots(5)
    finally:
        for fd in others:
            os.close(fd)
    monkeypatch.setattr(device_module, "_HELD_GPU_LOCKS", {})  # a rank: a process of its own
    monkeypatch.setenv(device_module.SLOTS_HELD_ENV, "1234")
    fd = hold(locks / "gpu-GPU-0.lock")
    try:
        assert device_module.select_device("cuda:0") == torch.device("cuda:0")
    finally:
        os.close(fd)
    assert capsys.readouterr().err == ""


def test_too_few_free_gpus_for_a_launcher_is_one_line(gpus) -> None:
    locks = gpus(2)
    fd = hold(locks / "gpu-GPU-1.lock")
    try:
        with pytest.raises(RunStateError, match=r"^2 GPUs wanted but only 1 of the 2 visible are free"):
            device_module.claim_gpu_slots(2)
    finally:
        os.close(fd)


def test_unusable_lock_directory_falls_back_with_one_warning(gpus, tmp_path, monkeypatch, capsys) -> None:
    gpus(2)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("TINY_LLM_GPU_LOCK_DIR", str(blocker / "locks"))  # mkdir fails
    assert device_module.select_device("auto") == torch.device("cuda:0")
    assert device_module.select_device("cuda:1") == torch.device("cuda:1")
    err = capsys.readouterr().err
    assert "warning: GPU slots are not coordinated" in err and "TINY_LLM_GPU_LOCK_DIR" in err


def test_read_only_lock_directory_falls_back(gpus, monkeypatch, capsys) -> None:
    """A lock directory this user may not write (a shared host: another user's directory)."""
    locks = gpus(1)
    locks.mkdir()
    real_open = os.open

    def no_write(path, flags, *args):
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(device_module.os, "open", no_write)
    assert device_module.select_device("auto") == torch.device("cuda:0")
    assert "warning: GPU slots are not coordinated" in capsys.readouterr().err


def test_lock_file_of_another_user_is_locked_read_only(gpus, monkeypatch) -> None:
    locks = gpus(1)
    locks.mkdir()
    (locks / "gpu-GPU-0.lock").write_text("")
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(device_module.os, "open", read_only)
    assert device_module.select_device("auto") == torch.device("cuda:0")
    monkeypatch.setattr(device_module.os, "open", real_open)
    assert locked_elsewhere(locks / "gpu-GPU-0.lock")


def test_default_lock_directory_is_per_user(monkeypatch) -> None:
    monkeypatch.delenv("TINY_LLM_GPU_LOCK_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = device_module.gpu_lock_dir()
    assert path.name == f"tiny-llm-gpu-locks-{os.getuid()}"


@pytest.fixture
def fake_cuda_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """setup_runtime as on a GPU: device cuda:0, nothing else touches CUDA; precision restored after."""
    monkeypatch.setattr(device_module, "select_device", lambda requested: torch.device("cuda:0"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_tf32_matmuls_on_cuda_and_ieee_when_deterministic(fake_cuda_runtime, monkeypatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        device_module.setup_runtime(load_recipe(["tiny"], ["runtime.device=cuda:0"]))
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    # Inductor's GEMM autotuning reads the global getter: it must stay readable (no mixed-API error).
    assert torch.get_float32_matmul_precision() == "high"
    deterministic = load_recipe(["tiny"], ["runtime.device=cuda:0", "runtime.deterministic=true"])
    device_module.setup_runtime(deterministic)
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.get_float32_matmul_precision() == "highest"
