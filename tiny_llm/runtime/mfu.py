"""Model FLOPs utilisation: model FLOPs per token x tokens/s / device peak.

FLOPs per token are ``tiny_llm.budget.flops_per_token`` (6 x matmul weights + the causal attention term).
GPU peaks come from one table of the vendors' dense tensor-core figures (no sparsity), in the precision
the training's matmuls run in: BF16 under autocast (``runtime.amp``), else TF32 (FP32 master weights with
TF32 matmuls, the CUDA default unless ``runtime.deterministic``). Strict FP32 has no tensor-core figure
here, so no MFU is reported for it. The table serves the training loop's train rows and the benchmark
worker. On a CPU there is no trustworthy table, so the worker measures the peak: the best of a few timed
square matmuls in the training's dtype.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal

import torch

from tiny_llm.config import RecipeConfig
from tiny_llm.runtime.device import autocast_dtype

Precision = Literal["bf16", "tf32", "fp32"]


@dataclass(frozen=True)
class GpuPeak:
    name: str
    """Substring of ``torch.cuda.get_device_name`` (case-insensitive); the longest match wins."""
    bf16: float
    """Dense BF16 tensor-core FLOP/s (FP32 accumulate)."""
    tf32: float
    """Dense TF32 tensor-core FLOP/s."""


# Vendors' dense (non-sparsity) peaks; the datasheets print the sparsity figures, twice these.
# torch reports e.g. "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
# "NVIDIA H200 NVL", "NVIDIA GH200 480GB". NVL figures are per GPU.
GPU_DENSE_PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak("H100", bf16=989.4e12, tf32=494.7e12),  # H100 SXM
    GpuPeak("H100 PCIe", bf16=756.0e12, tf32=378.0e12),
    GpuPeak("H100 NVL", bf16=835.0e12, tf32=418.0e12),
    GpuPeak("H200", bf16=989.4e12, tf32=494.7e12),  # H200 SXM: the H100 SXM's tensor cores
    GpuPeak("H200 NVL", bf16=835.0e12, tf32=418.0e12),
    GpuPeak("GH200", bf16=989.4e12, tf32=494.7e12),  # its Hopper GPU is an H100 SXM's
    GpuPeak("A100", bf16=312.0e12, tf32=156.0e12),
    GpuPeak("L40S", bf16=362.0e12, tf32=183.0e12),
)
PEAK_FLOPS_ENV = "TINY_LLM_PEAK_FLOPS"
"""Overrides the table for the training loop's MFU (FLOP/s)."""


@dataclass(frozen=True)
class Peak:
    flops_per_second: float
    source: str
    """'table:<name> <precision> dense' or 'measured:<dtype> matmul <n>x<n>'."""


def matmul_precision(recipe: RecipeConfig, device: torch.device) -> Precision:
    """The precision the training's matmuls run in on ``device``."""
    if autocast_dtype(recipe, device) == torch.bfloat16:
        return "bf16"
    if device.type == "cuda" and not recipe.runtime.deterministic:
        return "tf32"
    return "fp32"


def gpu_table_entry(device_name: str) -> GpuPeak | None:
    """The table's entry for a device name: the longest (most specific) matching name."""
    name = device_name.lower()
    matches = [entry for entry in GPU_DENSE_PEAKS if entry.name.lower() in name]
    return max(matches, key=lambda entry: len(entry.name)) if matches else None


def gpu_peak(device_name: str, precision: Precision = "bf16") -> Peak | None:
    """The dense tensor-core peak of a GPU in ``precision``; None for an unknown GPU or strict FP32."""
    entry = gpu_table_entry(device_name)
    if entry is None or precision == "fp32":
        return None
    return Peak(getattr(entry, precision), f"table:{entry.name} {precision} dense")


def peak_flops(device_name: str, precision: Precision = "bf16") -> float | None:
    """The training loop's MFU peak: $TINY_LLM_PEAK_FLOPS, else the table's figure, else None."""
    override = os.environ.get(PEAK_FLOPS_ENV)
    if override:
        return float(override)
    peak = gpu_peak(device_name, precision)
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


def device_peak(device: torch.device, precision: Precision) -> Peak | None:
    """The peak FLOP/s MFU is measured against; None for an unknown GPU (or strict FP32 on one)."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), precision)
    return measure_cpu_matmul_peak(torch.bfloat16 if precision == "bf16" else torch.float32)


def mfu(flops_per_token: float, tokens_per_second: float, peak: Peak | None) -> float | None:
    if peak is None or peak.flops_per_second <= 0:
        return None
    return flops_per_token * tokens_per_second / peak.flops_per_second
