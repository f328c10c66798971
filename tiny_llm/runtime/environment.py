"""environment.json: what ran where (software, hardware, Slurm, identities, kernels)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

PACKAGES = ("tiny-llm", "torch", "numpy", "tokenizers", "datasets", "safetensors", "sentencepiece", "pyyaml")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision() -> str | None:
    """Commit of the source tree this package runs from (None outside a git checkout)."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "cpu": cpu_model(), "cpu_count": os.cpu_count()}
    info["cpu_affinity"] = len(os.sched_getaffinity(0))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "total_memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    return info


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def capture_environment(device: torch.device, **extra: Any) -> dict[str, Any]:
    """Environment facts plus caller-supplied run facts (identities, parameters, kernels, compiled)."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "packages": package_versions(),
        "git_revision": git_revision(),
        "hardware": device_info(device),
        "threads": torch.get_num_threads(),
        "slurm": {k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_")},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        **extra,
    }
