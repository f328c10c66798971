"""Files whose content the plan decides (recipes, tuning profiles, campaign settings), and their digests.

A rule writes each one, only when its content changes (the content is that rule's param); the jobs that read
it take it as a plain input, so the call that rewrites a file also reruns them. The plan never reads these
files back: their content is what the workflow config says now (docs/architecture.md, "Results of earlier
versions").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_json, atomic_write_yaml, canonical_json


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
