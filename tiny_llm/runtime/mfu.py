"""Model FLOPs utilisation: model FLOPs per token x tokens/s / device peak.

GPU peaks are the vendors' dense BF16 tensor-core figures (no sparsity): one table,
used by the training loop's train rows and by the benchmark worker. On a CPU there
is no trustworthy table, so the worker measures the peak: the best of a few timed
square matmuls in the dtype the training uses.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

# (substring of torch.cuda.get_device_name, dense BF16 peak FLOP/s). First match wins, so the
# more specific names come first.
GPU_BF16_DENSE_PEAKS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.4e12),
    ("H200", 989.4e12),
    ("H100 NVL", 835.0e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.4e12),
    ("A100", 312.0e12),
    ("L40S", 362.0e12),
)
PEAK_FLOPS_ENV = "TINY_LLM_PEAK_FLOPS"
"""Overrides the table for the training loop's MFU (FLOP/s)."""


@dataclass(frozen=True)
class Peak:
    flops_per_second: float
    source: str
    """'table:<name>' or 'measured:<dtype> matmul <n>x<n>'."""


def gpu_peak(device_name: str) -> Peak | None:
    for key, flops in GPU_BF16_DENSE_PEAKS:
        if key.lower() in device_name.lower():
            return Peak(flops, f"table:{key} bf16 dense")
    return None


def peak_flops(device_name: str) -> float | None:
    """The training loop's MFU peak: $TINY_LLM_PEAK_FLOPS, else the table's figure, else None."""
    override = os.environ.get(PEAK_FLOPS_ENV)
    if override:
        return float(override)
    peak = gpu_peak(device_name)
    return peak.flops_per_second if peak else None


def measure_cpu_matmul_peak(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> Peak:
    """Best-of-``repeats`` FLOP/s of an n x n x n matmul with the current torch thread count."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm up the kernel choice and caches
    inner = max(1, int(2e9 // (2 * size**3)))  # about 2 GFLOP per timing: long enough to be stable
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / inner)
    name = str(dtype).replace("torch.", "")
    return Peak(
        2.0 * size**3 / best, f"measured:{name} matmul {size}x{size} x{torch.get_num_threads()} threads"
    )


def device_peak(device: torch.device, cpu_dtype: torch.dtype) -> Peak | None:
    """The peak FLOP/s MFU is measured against; None for an unknown GPU."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device))
    return measure_cpu_matmul_peak(cpu_dtype)


def mfu(flops_per_token: float, tokens_per_second: float, peak: Peak | None) -> float | None:
    if peak is None or peak.flops_per_second <= 0:
        return None
    return flops_per_token * tokens_per_second / peak.flops_per_second
