"""The directories a command writes (``--output``, ``--output-dir``): the marker that says a directory is one
tiny-llm wrote, and the policy it follows: a folder of anyone else's is never written into, emptied or
replaced, and one of ours is replaced only on request (``--force``) and atomically.

File primitives (atomic writes, reads, locks) are ``tiny_llm.io``'s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from tiny_llm.errors import ConfigError
from tiny_llm.io import UMASK, atomic_write_text, fsync_dir

OUTPUT_MARKER = ".tiny-llm-output"
"""A file in every directory an ``--output`` command writes: it marks the directory as one it may replace."""


def check_swappable(output: str | os.PathLike[str]) -> None:
    """Refuse an ``output`` that a rename cannot swap: ``.`` or ``..``, the working directory or one holding
    it (renamed away and deleted under the running process), a mount point (the rename fails: EBUSY)."""
    output = Path(output)
    resolved = output.resolve()
    cwd = Path.cwd().resolve()
    if output.name in ("", ".", "..") or resolved == cwd or resolved in cwd.parents:
        raise ConfigError(
            f"--output {output} is the working directory or holds it, which cannot be replaced; "
            "choose a new path, such as a subdirectory"
        )
    if os.path.ismount(resolved):
        raise ConfigError(
            f"--output {output} is a mount point, which cannot be replaced; choose a new path under it"
        )


def check_replaceable(output: str | os.PathLike[str], *, force: bool) -> None:
    """Refuse an ``output`` that cannot be swapped (check_swappable), and an existing non-empty one unless it
    holds OUTPUT_MARKER and ``force`` is given: a directory this project did not write is never deleted, and
    one it wrote only on request."""
    output = Path(output)
    check_swappable(output)
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise ConfigError(f"--output {output} exists and is not a directory; choose a new path")
    if not output.exists() or not any(output.iterdir()):
        return
    if not (output / OUTPUT_MARKER).is_file():
        raise ConfigError(
            f"--output {output} is a non-empty directory that tiny-llm did not write; choose a new path"
        )
    if not force:
        raise ConfigError(f"--output {output} already holds an earlier output; pass --force to replace it")


@contextlib.contextmanager
def replacing_directory(
    output: str | os.PathLike[str], *, force: bool = False, marked: bool = True
) -> Iterator[Path]:
    """Yield a temp sibling of ``output`` to fill; on success it replaces ``output``, else it is removed.

    ``marked``: the new directory gets OUTPUT_MARKER, and an existing ``output`` is replaced only as
    check_replaceable allows (checked before and again just before the swap). Unmarked callers guard
    ``output`` themselves."""
    output = Path(output)
    if marked:
        check_replaceable(output, force=force)
    else:
        check_swappable(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield tmp
        if marked:
            (tmp / OUTPUT_MARKER).write_text("written by tiny-llm; replaced only with --force\n")
            check_replaceable(output, force=force)
        tmp.chmod(0o777 & ~UMASK)  # mkdtemp makes it private
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old.", dir=output.parent))
            try:
                os.replace(output, old / output.name)  # out of the way first: no reader sees half a tree
            except BaseException:
                with contextlib.suppress(OSError):  # kept if the rename did happen: nothing is lost
                    old.rmdir()
                raise
            os.replace(tmp, output)
            shutil.rmtree(old)
        else:
            os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(output.parent)


CLAIMED_TEXT = "written by tiny-llm: its commands write here again\n"


def check_output_dir(
    output: str | os.PathLike[str], option: str, *, inputs: Iterable[str | os.PathLike[str]] = ()
) -> Path:
    """Refuse, in one line naming ``option``, a directory that files are written into when it exists and is
    not a directory, or is non-empty and holds neither OUTPUT_MARKER nor only the command's own ``inputs``
    (the workflow's analysis layout: the jobs' directories, then their summary beside them): a user's files
    are never written over, and an output of an earlier version, made before outputs were marked, is not
    taken for one of ours (docs/architecture.md, "Results of earlier versions")."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{option} {output} exists and is not a directory; choose a new path")
    if not output.is_dir() or (output / OUTPUT_MARKER).is_file():
        return output
    skipped = {os.path.abspath(path) for path in inputs}
    if all(os.path.abspath(entry) in skipped for entry in output.iterdir()):
        return output
    raise ConfigError(
        f"{option} {output} is a non-empty directory that tiny-llm did not write; choose a new or empty one"
    )


def claim_output_dir(
    output: str | os.PathLike[str], option: str, *, inputs: Iterable[str | os.PathLike[str]] = ()
) -> Path:
    """check_output_dir, then ``output`` created where missing and marked with OUTPUT_MARKER, so that its
    command (a report, a benchmark's scratch directory) writes there again on a rerun."""
    output = check_output_dir(output, option, inputs=inputs)
    output.mkdir(parents=True, exist_ok=True)
    marker = output / OUTPUT_MARKER
    if not marker.is_file():
        atomic_write_text(marker, CLAIMED_TEXT)
    return output
