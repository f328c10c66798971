"""Files whose content the plan decides (recipes, tuning profiles, campaign settings), and their digests.

A rule writes each one, only when its content changes (the content is that rule's param); the jobs that read
it take it as a plain input, so the call that rewrites a file also reruns them. The plan never reads these
files back: their content is what the workflow config says now (docs/architecture.md, "Results of earlier
versions").
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import ConfigError
from tiny_llm.io import atomic_write_json, atomic_write_yaml, canonical_json

PLAN_FILES_ENV = "TINY_LLM_PLAN_FILES"
"""A job's plan files and their digests (JSON: path -> digest), which `python -m tiny_llm` checks first."""


def content_digest(content: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(content)).encode()).hexdigest()[:16]


class PlanFiles:
    def __init__(self) -> None:
        self._content: dict[str, dict[str, Any]] = {}

    def add(self, path: str, content: Mapping[str, Any]) -> str:
        """Plan ``path`` with ``content``."""
        self._content[path] = dict(content)
        return path

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
        """PLAN_FILES_ENV's value for a job reading ``paths``: its plan files, with their digests."""
        return json.dumps({path: self.digest(path) for path in paths if path in self._content})

    def pattern(self) -> str:
        """A wildcard constraint matching exactly these paths (there is always one: the export prompts)."""
        return "|".join(re.escape(path) for path in sorted(self._content))


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
    """Refuse, in one line, a plan file whose content is not the plan's (PLAN_FILES_ENV): edited by hand or
    restored from a backup, it would be trained as it stands, its result belonging to no config."""
    for path, digest in (json.loads(expected) if expected else {}).items():
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
