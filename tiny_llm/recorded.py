"""Files one job writes for another to read (a campaign's templates and stage recipes, a tuning plan and the
recipe it selects), each carrying the digest of its content as its writer left it: the job that reads one
refuses it, in one line, once it was edited (``TINY_LLM_PLAN_FILES`` marks such a file ``RECORDED``,
tiny_llm.pipeline.files), instead of training or measuring a recipe no config made.

YAML files carry the digest in a first comment line, which no reader sees; a JSON file in a ``written_by``
key, which its reader drops (``without_record``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.io import atomic_write_json, atomic_write_text, canonical_json

RECORDED = "recorded"
"""What TINY_LLM_PLAN_FILES says of a file whose digest its writer recorded in it."""
RECORD_KEY = "written_by"
_HEADER = re.compile(r"# written by tiny-llm (?P<writer>[a-z -]+); content digest (?P<digest>[0-9a-f]{16})\b")


def content_digest(content: Mapping[str, Any]) -> str:
    """The digest of a mapping's content, whatever its layout on disk (key order, YAML or JSON)."""
    return hashlib.sha256(canonical_json(dict(content)).encode()).hexdigest()[:16]


def write_recorded_yaml(path: str | Path, content: Mapping[str, Any], writer: str, comment: str = "") -> None:
    """``content`` as YAML (key order kept) under a line recording ``writer`` and the content's digest; then
    ``comment`` (lines starting with '#') for people who open the file."""
    header = f"# written by tiny-llm {writer}; content digest {content_digest(content)} (edited: refused)\n"
    atomic_write_text(path, header + comment + yaml.safe_dump(dict(content), sort_keys=False))


def write_recorded_json(path: str | Path, content: Mapping[str, Any], writer: str) -> None:
    record = {"writer": writer, "digest": content_digest(content)}
    atomic_write_json(path, {**content, RECORD_KEY: record})


def without_record(data: dict[str, Any]) -> dict[str, Any]:
    """A recorded JSON file's content as its writer gave it."""
    return {key: value for key, value in data.items() if key != RECORD_KEY}


def recorded_problem(path: str | Path) -> str | None:
    """Why ``path`` is not what its writer recorded (None: it is): edited, or carrying no record at all."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith(".json"):
            data = json.loads(text)
            record = data.get(RECORD_KEY) if isinstance(data, dict) else None
            writer, digest = (record or {}).get("writer"), (record or {}).get("digest")
            content = without_record(data) if isinstance(data, dict) else None
        else:
            match = _HEADER.match(text)
            writer, digest = (match["writer"], match["digest"]) if match else (None, None)
            content = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return f"cannot be read ({type(exc).__name__})"
    if digest is None:
        return "carries no record of the job that wrote it (written by hand or by another version?)"
    if not isinstance(content, dict) or content_digest(content) != digest:
        return f"is not what `{writer}` wrote (edited since?)"
    return None
