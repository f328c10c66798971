"""The compile caches: a private directory of this user's, set before anything compiles."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError
from tiny_llm.runtime import compile_cache
from tiny_llm.runtime.device import setup_runtime


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", compile_cache.ENV):
        monkeypatch.setenv(name, "")  # recorded, so the test's own settings are undone after it
        monkeypatch.delenv(name)
    monkeypatch.setattr(compile_cache, "_applied", [])
    monkeypatch.setattr(compile_cache.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_setup_runtime_points_both_caches_at_a_private_directory(tmp_path: Path) -> None:
    setup_runtime(load_recipe(["tiny"], ["runtime.cpu_threads=1"]))
    expected = tmp_path / "tmp" / f"tiny-llm-compile-{os.getuid()}"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(expected)
    assert os.environ["TRITON_CACHE_DIR"] == str(expected / "triton")
    assert expected.stat().st_uid == os.getuid() and mode(expected) == 0o700
    assert compile_cache.setup_compile_cache() == expected  # a second setup keeps its own choice


def test_the_workflow_cache_is_used_and_narrowed_to_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "results" / "compile-cache"
    shared.mkdir(parents=True, mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv(compile_cache.ENV, str(shared))
    assert compile_cache.setup_compile_cache() == shared
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(shared) and mode(shared) == 0o700


def test_a_users_own_inductor_cache_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache.setup_compile_cache() is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "tmp" / f"tiny-llm-compile-{os.getuid()}"
    planted.mkdir(parents=True)
    os.chown(planted, 4242, 4242)
    with pytest.raises(
        ConfigError, match=r"belongs to another user \(uid 4242\); set TINY_LLM_COMPILE_CACHE"
    ):
        compile_cache.setup_compile_cache()
