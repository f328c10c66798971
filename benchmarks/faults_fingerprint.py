"""What a campaign decided, as a fingerprint to compare: weights' hashes and records minus timing fields."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tiny_llm.io import read_json
from tiny_llm.train.rows import TIMING_FIELDS


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _json(path: Path) -> Any:
    return _strip(read_json(path)) if path.is_file() else None


def _metrics(path: Path) -> Any:
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return hashlib.sha256(json.dumps(_strip(rows), sort_keys=True).encode()).hexdigest()


def fingerprint(workdir: Path) -> dict[str, Any]:
    """Everything the campaign decided, minus what measures time and memory."""
    root = workdir / "results/campaign"
    out: dict[str, Any] = {}
    for run in sorted(p.parent for p in root.glob("stage*/*/recipe.yaml")):
        name = str(run.relative_to(root))
        out[f"{name}/final.safetensors"] = _sha256(run / "final.safetensors")
        out[f"{name}/result.json"] = _json(run / "result.json")
        out[f"{name}/best.json"] = _json(run / "best.json")
        out[f"{name}/metrics.jsonl"] = _metrics(run / "metrics.jsonl")
    for ranking in sorted(root.glob("stage*/ranking.json")):
        out[str(ranking.relative_to(root))] = _json(ranking)
    out["report/comparison.json"] = _json(root / "report/comparison.json")
    for selected in sorted(root.glob("report/selected-*.yaml")):
        out[str(selected.relative_to(root))] = selected.read_text()
    return out


def differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return [key for key in sorted(set(reference) | set(other)) if reference.get(key) != other.get(key)]
