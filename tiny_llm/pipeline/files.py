"""Files whose content the plan decides (recipes, tuning profiles, campaign settings), and their digests.

A rule writes each one, only when its content changes (the content is that rule's param); the jobs that read
it take it as a plain input, so the call that rewrites a file also reruns them.

A file already on disk that says the same as the planned content, read the way its readers read it (a
recipe without a key added since, whose default it takes; a tuning profile in the earlier `sets` form), is
kept as it is: its content stays the param, so a tree written by an earlier version stays complete.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.config import recipe_from_dict, recipe_to_dict
from tiny_llm.errors import TinyLLMError
from tiny_llm.io import atomic_write_json, atomic_write_yaml, canonical_json

NormalForm = Callable[[dict[str, Any]], Any]
"""What a file says, as its readers take it: two contents with equal normal forms are the same plan."""


def content_digest(content: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(content)).encode()).hexdigest()[:16]


def recipe_normal_form(content: dict[str, Any]) -> dict[str, Any]:
    """A recipe file as the trainer reads it: every key, each one missing at its default."""
    return recipe_to_dict(recipe_from_dict(content))


class PlanFiles:
    def __init__(self, check_files: bool = True) -> None:
        """``check_files``: look at the files already on disk (the Snakefile's plan, in its working
        directory); off, the content is always the planned one (commands that only read a plan)."""
        self._content: dict[str, dict[str, Any]] = {}
        self._on_disk: set[str] = set()
        self.check_files = check_files

    def add(self, path: str, content: Mapping[str, Any], normal_form: NormalForm | None = None) -> str:
        """Plan ``path`` with ``content``; with ``normal_form``, an existing file saying the same is kept."""
        planned = dict(content)
        if normal_form is not None and self.check_files:
            existing = _existing_if_same(path, planned, normal_form)
            if existing is not None:
                planned = existing
                self._on_disk.add(path)
        self._content[path] = planned
        return path

    def on_disk(self, path: str) -> bool:
        """Whether the file on disk already holds the planned content (write_plan_file will not run);
        known for the files added with a normal form, while files are checked."""
        return path in self._on_disk

    def add_recipe(self, path: str, content: Mapping[str, Any]) -> str:
        return self.add(path, content, recipe_normal_form)

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


def _existing_if_same(path: str, content: dict[str, Any], normal_form: NormalForm) -> dict[str, Any] | None:
    """The file at ``path`` if it reads as ``content`` does, else None (also when it is missing, damaged or
    not a valid file of its kind: then the planned content is written)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        existing = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(existing, dict):
        return None
    if existing == content:
        return existing
    try:
        same = canonical_json(normal_form(existing)) == canonical_json(normal_form(content))
    except (TinyLLMError, TypeError, ValueError, KeyError):
        return None
    return existing if same else None
