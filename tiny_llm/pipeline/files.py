"""Files whose content the plan decides (recipes, tuning profiles, campaign settings), and their digests.

A rule writes each one, only when its content changes; the jobs that read it take it as a plain input, so the
call that rewrites a file also reruns them. What says the content changed is a stamp whose path carries the
content's digest (``PlanFiles.stamp``), an input of the named targets: a new digest is a missing stamp, and
the job that makes it writes the file too, so that its readers, now older than the file, run again. That
holds under every rerun trigger and without Snakemake's records in .snakemake/ (which the writer's params
trigger alone needed); Snakemake never reruns a job for a missing input of a job whose outputs exist, which is
why the stamps are the targets' inputs and not the readers'. The plan never reads these files back: their
content is what the workflow config says now (docs/architecture.md, "Results of earlier versions").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import ConfigError
from tiny_llm.io import atomic_write_json, atomic_write_yaml
from tiny_llm.pipeline.layout import PLAN_STAMP, fill
from tiny_llm.recorded import RECORDED, content_digest, recorded_problem

PLAN_FILES_ENV = "TINY_LLM_PLAN_FILES"
"""A job's plan files and their digests (JSON: path -> digest), which `python -m tiny_llm` checks first."""


class PlanFiles:
    def __init__(self) -> None:
        self._content: dict[str, dict[str, Any]] = {}
        self._stage: dict[str, str] = {}
        self._recorded: set[str] = set()
        self._recorded_patterns: list[re.Pattern[str]] = []

    def add(self, path: str, content: Mapping[str, Any], *, stage: str) -> str:
        """Plan ``path`` with ``content``; ``stage``: the workflow stage whose jobs read it."""
        self._content[path] = dict(content)
        self._stage[path] = stage
        return path

    def add_recorded(self, paths: Iterable[str], pattern: str | None = None) -> None:
        """Files a job writes for another job to read, their digest recorded in them (tiny_llm.recorded): by
        path, and every path matching ``pattern`` (a regular expression: files the plan cannot list, such as
        the runs a checkpoint adds)."""
        self._recorded.update(paths)
        if pattern is not None:
            self._recorded_patterns.append(re.compile(pattern))

    def is_recorded(self, path: str) -> bool:
        return path in self._recorded or any(p.fullmatch(path) for p in self._recorded_patterns)

    def __contains__(self, path: str) -> bool:
        return path in self._content

    def content(self, path: str) -> dict[str, Any]:
        return self._content[path]

    def digest(self, path: str) -> str:
        return content_digest(self._content[path])

    def digest_of(self, paths: list[str]) -> str:
        """The digests of those ``paths`` that are plan files: changes exactly when their content does."""
        return " ".join(self.digest(path) for path in paths if path in self._content)

    def expected(self, paths: list[str]) -> str:
        """PLAN_FILES_ENV's value for a job reading ``paths``: its plan files, with their digests, and the
        files written by other jobs, RECORDED."""
        planned = {path: self.digest(path) for path in paths if path in self._content}
        return json.dumps({**planned, **{path: RECORDED for path in paths if self.is_recorded(path)}})

    def pattern(self) -> str:
        """A wildcard constraint matching exactly these paths (there is always one: the export prompts)."""
        return "|".join(re.escape(path) for path in sorted(self._content))

    def stamp(self, path: str) -> str:
        """The stamp of ``path``'s planned content: a path that changes exactly when the content does."""
        return fill(PLAN_STAMP, plan_stamp=f"{_path_key(path)}-{self.digest(path)}")

    def stamp_pattern(self) -> str:
        """A wildcard constraint matching the names (PLAN_STAMP's plan_stamp) of exactly today's stamps."""
        return "|".join(re.escape(self.stamp(path).rsplit("/", 1)[1]) for path in sorted(self._content))

    def stamps(self, stages: Iterable[str]) -> list[str]:
        """The stamps of the files the jobs of ``stages`` read."""
        wanted = set(stages)
        return [self.stamp(path) for path in sorted(self._content) if self._stage[path] in wanted]

    def stamped(self, stamp: str) -> str:
        """The plan file whose stamp ``stamp`` is."""
        name = Path(stamp).name
        return next(path for path in sorted(self._content) if self.stamp(path).endswith(f"/{name}"))


def _path_key(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:16]


def write_stamp(stamp: str | Path) -> None:
    """Make ``stamp`` and remove the stamps of the same file's earlier content: back at that content, the
    file is written again (an old stamp left behind would be taken for its new one)."""
    stamp = Path(stamp)
    key = stamp.name.split("-", 1)[0]
    stamp.parent.mkdir(parents=True, exist_ok=True)
    for old in stamp.parent.glob(f"{key}-*"):
        if old != stamp:
            old.unlink(missing_ok=True)
    stamp.touch()


def write_plan_file(path: str | Path, content: Mapping[str, Any], log: str | Path | None = None) -> None:
    """Write atomically as JSON or YAML, by the file's suffix; ``log`` gets one line saying so."""
    if str(path).endswith(".json"):
        atomic_write_json(path, content)
    else:
        atomic_write_yaml(path, content)
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(f"wrote {path} (content {content_digest(content)})\n", encoding="utf-8")


def check_plan_files(expected: str) -> None:
    """Refuse, in one line, a plan file whose content is not the plan's, or a file another job wrote that is
    not what it recorded (PLAN_FILES_ENV): edited by hand or restored from a backup, it would be trained or
    measured as it stands, its result belonging to no config."""
    for path, digest in (json.loads(expected) if expected else {}).items():
        if digest == RECORDED:
            problem = recorded_problem(path)
            if problem is not None:
                raise ConfigError(
                    f"{path} {problem}; delete it and rerun the same snakemake command: the workflow writes "
                    "it again"
                )
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
            content = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
            found = content_digest(content) if isinstance(content, dict) else "not a mapping"
        except (OSError, ValueError, yaml.YAMLError) as exc:
            found = type(exc).__name__
        if found != digest:
            raise ConfigError(
                f"{path} is not what the workflow config says (edited since the workflow wrote it?); delete "
                "it and rerun the same snakemake command: the workflow writes it again from the config"
            )
