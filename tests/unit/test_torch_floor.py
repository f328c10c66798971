"""pyproject's torch floor covers the newest torch API the library calls (a table of the ones that set it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# API the library uses -> the first torch release that has it.
FIRST_RELEASE = {
    "torch.optim.Muon": (2, 9),
    "get_total_norm": (2, 6),
    "clip_grads_with_norm_": (2, 6),
    "_fused_adamw_": (2, 4),  # on CPU tensors too (the packed optimizer)
    "sdpa_kernel": (2, 3),
    "CUDNN_ATTENTION": (2, 3),
}


def torch_floor() -> tuple[int, int]:
    pyproject = (REPO / "pyproject.toml").read_text()
    major, minor = re.search(r'^\s*"torch>=(\d+)\.(\d+)', pyproject, re.M).groups()
    return int(major), int(minor)


def test_torch_floor_covers_the_apis_the_library_calls() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "tiny_llm").rglob("*.py"))
    used = {api: version for api, version in FIRST_RELEASE.items() if re.search(rf"\b{api}\b", source)}
    assert "get_total_norm" in used  # the table still describes the code
    needed = max(used.values())
    assert torch_floor() >= needed, f"pyproject says torch>={torch_floor()}, the code needs {needed}: {used}"


def test_what_is_newer_than_the_floor_is_asked_for_by_name_not_assumed() -> None:
    """forward_sync_buffers is DDP's since 2.13, above the floor: the code passes it only where DDP's own
    signature has it (train.distributed.no_buffer_sync), never as a literal keyword."""
    source = (REPO / "tiny_llm" / "train" / "distributed.py").read_text()
    assert "forward_sync_buffers=" not in source and '"forward_sync_buffers" in accepted' in source


# What the library relies on to be safe -> the first torch release where it is.
SAFE_SINCE = {
    # torch.load's restricted unpickler: a code-execution flaw fixed in 2.10
    "weights_only=True": (2, 10),
}


def test_torch_floor_admits_no_release_with_a_known_flaw_in_what_the_library_relies_on() -> None:
    source = "\n".join(p.read_text() for p in (REPO / "tiny_llm").rglob("*.py"))
    used = {what: version for what, version in SAFE_SINCE.items() if what in source}
    assert "weights_only=True" in used  # training states and evaluation checkpoints are loaded so
    assert torch_floor() >= max(used.values()), f"pyproject says torch>={torch_floor()}: {used}"
