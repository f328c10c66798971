"""replacing_directory: an output it cannot swap by a rename (the working directory, a mount point) is
refused in one line before anything is written, and a failed swap leaves no folder behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tiny_llm import output_dirs
from tiny_llm.errors import ConfigError
from tiny_llm.output_dirs import OUTPUT_MARKER, replacing_directory


def output_of_ours(path: Path) -> dict[str, bytes]:
    path.mkdir()
    (path / OUTPUT_MARKER).write_text("written by tiny-llm\n")
    (path / "model.safetensors").write_bytes(b"weights")
    return {p.name: p.read_bytes() for p in path.iterdir()}


@pytest.mark.parametrize("marked", [True, False])
def test_the_working_directory_is_refused_and_nothing_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marked: bool
) -> None:
    before = output_of_ours(tmp_path / "out")
    monkeypatch.chdir(tmp_path / "out")
    for target in (".", "./", str(tmp_path / "out"), "..", str(tmp_path)):
        with pytest.raises(ConfigError) as err, replacing_directory(target, force=True, marked=marked):
            pytest.fail("nothing may be written")
        assert str(err.value) == (
            f"--output {Path(target)} is the working directory or holds it, which cannot be replaced; "
            "choose a new path, such as a subdirectory"
        )
    assert {p.name: p.read_bytes() for p in Path.cwd().iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_mount_point_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = output_of_ours(tmp_path / "mnt")
    monkeypatch.setattr(output_dirs.os.path, "ismount", lambda path: Path(path) == tmp_path / "mnt")
    with pytest.raises(ConfigError) as err, replacing_directory(tmp_path / "mnt", force=True):
        pytest.fail("nothing may be written")
    assert str(err.value) == (
        f"--output {tmp_path / 'mnt'} is a mount point, which cannot be replaced; choose a new path under it"
    )
    assert {p.name: p.read_bytes() for p in (tmp_path / "mnt").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]


def test_a_swap_that_fails_leaves_no_old_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = output_of_ours(tmp_path / "out")
    real_replace = os.replace

    def busy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(src) == tmp_path / "out":
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_replace(src, dst)

    monkeypatch.setattr(output_dirs.os, "replace", busy)
    with pytest.raises(OSError, match="busy"), replacing_directory(tmp_path / "out", force=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
