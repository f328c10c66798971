"""The compile caches: a private directory of this user's, set before anything compiles."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tiny_llm import io
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


def test_the_workflow_cache_is_a_private_directory_inside_the_one_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "results" / "compile-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv(compile_cache.ENV, str(shared))
    expected = shared / f"tiny-llm-compile-{os.getuid()}"
    assert compile_cache.setup_compile_cache() == expected
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(expected) and mode(expected) == 0o700
    assert compile_cache.setup_compile_cache() == expected  # the next job finds it as it was left


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


def test_a_link_at_the_default_location_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    """A link planted at the predictable name: never followed, neither for a mode change nor for reading."""
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o777)
    (victim / "planted.py").write_text("entry")
    (tmp_path / "tmp").mkdir()
    compile_cache.default_compile_cache().symlink_to(victim)
    with pytest.raises(ConfigError) as err:
        compile_cache.setup_compile_cache()
    assert str(err.value) == (
        f"compile cache {compile_cache.default_compile_cache()}: is a symbolic link; set "
        "TINY_LLM_COMPILE_CACHE to a directory of yours"
    )
    assert mode(victim) == 0o777 and (victim / "planted.py").read_text() == "entry"
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


def test_a_link_in_place_of_the_workflow_cache_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    victim.chmod(0o777)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / f"tiny-llm-compile-{os.getuid()}").symlink_to(victim)
    monkeypatch.setenv(compile_cache.ENV, str(shared))
    with pytest.raises(ConfigError, match=r"is a symbolic link; point TINY_LLM_COMPILE_CACHE \(the workflow"):
        compile_cache.setup_compile_cache()
    assert mode(victim) == 0o777


@pytest.mark.parametrize(
    "named_mode", [0o1777, 0o2775, 0o755], ids=["sticky-tmp", "setgid-own-group", "plain"]
)
def test_the_directory_named_is_never_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named_mode: int
) -> None:
    """A sticky /tmp keeps its sticky bit, a setgid directory of the user's own private group its group
    access."""
    named = tmp_path / "named"
    named.mkdir()
    named.chmod(named_mode)
    monkeypatch.setattr(io, "group_is_yours_alone", lambda gid: gid == named.stat().st_gid, raising=False)
    (named / "colleague.txt").write_text("theirs")
    monkeypatch.setenv(compile_cache.ENV, str(named))
    cache = compile_cache.setup_compile_cache()
    assert cache == named / f"tiny-llm-compile-{os.getuid()}" and mode(cache) & 0o777 == 0o700
    assert mode(named) == named_mode and (named / "colleague.txt").read_text() == "theirs"


def shared_group(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``path``'s group one with other members: as root a group of no user's, else the test's stand-in."""
    if os.getuid() == 0:
        os.chown(path, -1, 4242)
    else:
        monkeypatch.setattr(io, "group_is_yours_alone", lambda gid: False)


def test_a_group_writable_directory_without_the_sticky_bit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setgid 2775 project directory: a group member could rename the cache away after it was checked."""
    named = tmp_path / "project"
    named.mkdir()
    shared_group(named, monkeypatch)
    named.chmod(0o2775)
    monkeypatch.setenv(compile_cache.ENV, str(named))
    with pytest.raises(ConfigError) as err:
        compile_cache.setup_compile_cache()
    message = str(err.value)
    assert message.startswith(f"TINY_LLM_COMPILE_CACHE {named}: {named} may be written by group ")
    assert "has no sticky bit (mode 2775)" in message and "\n" not in message
    assert message.endswith("one only you (and root) can write, or add the sticky bit (chmod +t)")
    assert mode(named) == 0o2775 and list(named.iterdir()) == []


def test_a_group_writable_directory_above_the_named_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renaming the directory above swaps the cache just as well: results/ in a shared project directory."""
    project = tmp_path / "project"
    project.mkdir()
    shared_group(project, monkeypatch)
    project.chmod(0o2775)
    monkeypatch.setenv(compile_cache.ENV, str(project / "results" / "compile-cache"))
    with pytest.raises(ConfigError, match=rf"{project} may be written by group .* \(mode 2775\)"):
        compile_cache.setup_compile_cache()


def test_a_sticky_directory_anyone_may_write_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root-owned 1777 /tmp (as root the test's own 1777 directory is one; else the user's stands in)."""
    named = tmp_path / "sticky"
    named.mkdir()
    named.chmod(0o1777)
    monkeypatch.setenv(compile_cache.ENV, str(named))
    assert compile_cache.setup_compile_cache() == named / f"tiny-llm-compile-{os.getuid()}"


def test_the_default_refuses_a_temp_directory_others_may_write_without_the_sticky_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    shared_group(tmp, monkeypatch)
    tmp.chmod(0o775)
    with pytest.raises(ConfigError) as err:
        compile_cache.setup_compile_cache()
    assert str(err.value).startswith(
        f"compile cache {tmp}/tiny-llm-compile-{os.getuid()}: {tmp} may be written by group "
    )
    assert not (tmp / f"tiny-llm-compile-{os.getuid()}").exists()
    tmp.chmod(0o1777)
    assert compile_cache.setup_compile_cache() == tmp / f"tiny-llm-compile-{os.getuid()}"


def test_a_missing_named_directory_is_made_without_group_write_under_umask_002(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "compile-cache"))
    umask = os.umask(0o002)
    try:
        cache = compile_cache.setup_compile_cache()
    finally:
        os.umask(umask)
    assert cache is not None and mode(cache.parent) == 0o755


def test_a_tilde_is_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(compile_cache.ENV, "~/compile-cache")
    cache = compile_cache.setup_compile_cache()
    assert cache == tmp_path / "home" / "compile-cache" / f"tiny-llm-compile-{os.getuid()}"
    assert not Path("~").exists()


def test_a_directory_anyone_may_write_without_the_sticky_bit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "open"
    named.mkdir()
    named.chmod(0o777)
    monkeypatch.setenv(compile_cache.ENV, str(named))
    with pytest.raises(ConfigError) as err:
        compile_cache.setup_compile_cache()
    assert str(err.value) == (
        f"TINY_LLM_COMPILE_CACHE {named}: {named} may be written by every user and has no sticky bit (mode "
        "0777), so another user could replace the compile cache there with kernels of theirs; point "
        "TINY_LLM_COMPILE_CACHE (the workflow's compile_cache) at another directory, one only you (and root) "
        "can write, or add the sticky bit (chmod +t)"
    )
    assert mode(named) == 0o777 and list(named.iterdir()) == []


def test_an_existing_cache_directory_others_may_write_is_refused_not_narrowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "results" / "compile-cache"
    cache = named / f"tiny-llm-compile-{os.getuid()}"
    cache.mkdir(parents=True)
    cache.chmod(0o2775)
    monkeypatch.setenv(compile_cache.ENV, str(named))
    with pytest.raises(ConfigError) as err:
        compile_cache.setup_compile_cache()
    assert str(err.value) == (
        f"compile cache {cache}: writable by others (mode 2775); point TINY_LLM_COMPILE_CACHE (the "
        "workflow's compile_cache) at another directory"
    )
    assert mode(cache) == 0o2775


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_cache_directory_of_another_user_in_the_named_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "named"
    planted = named / f"tiny-llm-compile-{os.getuid()}"
    planted.mkdir(parents=True)
    os.chown(planted, 4242, 4242)
    monkeypatch.setenv(compile_cache.ENV, str(named))
    with pytest.raises(
        ConfigError, match=r"belongs to another user \(uid 4242\); point TINY_LLM_COMPILE_CACHE"
    ):
        compile_cache.setup_compile_cache()
