"""How a benchmark script ends: its JSON report on stdout and, with --output, the same text in a file (written
atomically, so a killed benchmark never leaves half a report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tiny_llm.io import atomic_write_bytes


def emit(report: dict[str, Any], output: str | Path | None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if output:
        atomic_write_bytes(Path(output), (text + "\n").encode())
