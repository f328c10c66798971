"""The MFU peak table: dense tensor-core peaks per GPU and matmul precision, most specific name first."""

from __future__ import annotations

import pytest
import torch

from tiny_llm.config import load_recipe
from tiny_llm.runtime.mfu import GPU_DENSE_PEAKS, PEAK_FLOPS_ENV, gpu_peak, matmul_precision, peak_flops

# Device names as torch.cuda.get_device_name reports them -> (dense BF16, dense TF32) TFLOP/s.
PEAKS = {
    "NVIDIA H100 80GB HBM3": (989.4, 494.7),  # SXM
    "NVIDIA H100 PCIe": (756.0, 378.0),
    "NVIDIA H100 NVL": (835.0, 418.0),
    "NVIDIA H200": (989.4, 494.7),  # SXM
    "NVIDIA H200 NVL": (835.0, 418.0),
    "NVIDIA GH200 480GB": (989.4, 494.7),
    "NVIDIA GH200 144G HBM3e": (989.4, 494.7),
    "NVIDIA A100-SXM4-80GB": (312.0, 156.0),
}


@pytest.mark.parametrize("name", sorted(PEAKS))
def test_dense_peaks_per_gpu_and_precision(name: str) -> None:
    bf16, tf32 = PEAKS[name]
    assert gpu_peak(name, "bf16").flops_per_second == pytest.approx(bf16 * 1e12)
    assert gpu_peak(name, "tf32").flops_per_second == pytest.approx(tf32 * 1e12)
    assert gpu_peak(name).flops_per_second == pytest.approx(bf16 * 1e12)  # BF16 unless told otherwise
    assert gpu_peak(name, "fp32") is None  # no tensor-core figure for strict FP32


def test_the_most_specific_name_wins_whatever_the_table_order() -> None:
    assert gpu_peak("NVIDIA H200 NVL", "bf16").source == "table:H200 NVL bf16 dense"
    assert gpu_peak("NVIDIA GH200 480GB", "tf32").source == "table:GH200 tf32 dense"
    assert gpu_peak("nvidia h100 pcie").source == "table:H100 PCIe bf16 dense"
    assert gpu_peak("Tesla T4") is None and gpu_peak("Intel(R) Xeon(R) CPU") is None
    names = [entry.name for entry in GPU_DENSE_PEAKS]
    assert len(names) == len(set(names))  # one table, one row per GPU


def test_loop_peak_follows_the_precision_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PEAK_FLOPS_ENV, raising=False)
    assert peak_flops("NVIDIA H100 NVL", "tf32") == pytest.approx(418e12)
    assert peak_flops("NVIDIA H100 NVL", "fp32") is None
    monkeypatch.setenv(PEAK_FLOPS_ENV, "1e12")
    assert peak_flops("NVIDIA H100 NVL", "tf32") == 1e12


def test_matmul_precision_of_a_recipe() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert matmul_precision(load_recipe(["tiny"], ["runtime.amp=true"]), cuda) == "bf16"
    assert matmul_precision(load_recipe(["tiny"], ["runtime.amp=false"]), cuda) == "tf32"
    deterministic = load_recipe(["tiny"], ["runtime.amp=false", "runtime.deterministic=true"])
    assert matmul_precision(deterministic, cuda) == "fp32"  # TF32 is off in deterministic mode
    assert matmul_precision(load_recipe(["tiny"], ["runtime.cpu_amp=true"]), cpu) == "bf16"
    assert matmul_precision(load_recipe(["tiny"], ["runtime.cpu_amp=false"]), cpu) == "fp32"
