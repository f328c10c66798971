"""runtime.memory_limit_mb: past the cap the benchmark worker records an out-of-memory, as on CUDA."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiny_llm.bench.worker import near_memory_limit
from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError
from tiny_llm.runtime.memory import cpu_out_of_memory, memory_limit, status_bytes

# A 32,000-token vocabulary on the tiny stack: 8 MiB of embedding (32 MiB with its gradient and Adam moments)
# and 4 x 64 x 32,000 x 4 B = 31 MiB per logits buffer, well past what the test process may have freed earlier
# and could reuse under the cap, in updates of a few milliseconds.
TINY = [
    "model.vocab_size=32000",
    "runtime.cpu_threads=1",
    "training.batch_tokens=256",
    "training.micro_batch_size=4",
]


@pytest.mark.slow  # two benchmark-worker processes, ~3 s each
@pytest.mark.parametrize(("limit_mb", "status"), [(16, "memory_limit"), (4096, "ok")])
def test_the_cap_decides_between_out_of_memory_and_a_measurement(
    limit_mb: int, status: str, tmp_path: Path
) -> None:
    # Its own process, as the throughput map runs it: memory a long test process freed earlier stays mapped
    # and could be reused under the cap, so an in-process cap would admit more than it says.
    output = tmp_path / "worker.json"
    sets = [*TINY, f"runtime.memory_limit_mb={limit_mb}"]
    command = [
        sys.executable,
        "-m",
        "tiny_llm",
        "benchmark-worker",
        "--config",
        "tiny",
        "--output",
        str(output),
    ]
    command += [*(a for s in sets for a in ("--set", s)), "--data-mode", "synthetic"]
    command += ["--warmup", "1", "--steps", "1", "--windows", "2"]
    proc = subprocess.run(command, capture_output=True, text=True)
    out = json.loads(output.read_text())
    assert out["status"] == status, out["error"]
    if status == "memory_limit":
        assert proc.returncode == 1 and out["error"].startswith("out of memory: CPU memory limit reached")
        assert out["tokens_per_second"] is None
    else:
        assert proc.returncode == 0 and out["tokens_per_second"] > 0
        # the cap and what it counts from are in the JSON; the guard measured the peak beyond that
        assert out["memory_limit_bytes"] == limit_mb * 2**20 and out["memory_baseline_bytes"] > 0
        assert out["peak_memory_bytes"] - out["memory_baseline_bytes"] < 0.9 * out["memory_limit_bytes"]


def test_allocator_failures_become_cuda_style_out_of_memory() -> None:
    message = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 bytes"
    with (
        pytest.raises(torch.OutOfMemoryError, match="memory limit reached: you tried to allocate 9 bytes"),
        cpu_out_of_memory(),
    ):
        raise RuntimeError(f"[enforce fail at alloc_cpu.cpp:127] {message}")
    with (
        pytest.raises(torch.OutOfMemoryError, match="memory limit reached: MemoryError"),
        cpu_out_of_memory(),
    ):
        raise MemoryError
    with pytest.raises(ValueError), cpu_out_of_memory():  # other errors pass through unchanged
        raise ValueError("not memory")


def test_the_cap_is_lifted_on_leaving_and_counts_from_what_the_process_holds() -> None:
    before = resource.getrlimit(resource.RLIMIT_DATA)
    with memory_limit(64, torch.device("cpu")) as cap:
        soft = resource.getrlimit(resource.RLIMIT_DATA)[0]
        held = status_bytes("VmData")  # what the process holds once the cap is set (freed heap returned)
        assert soft == pytest.approx(held + 64 * 2**20, abs=4 * 2**20)  # 64 MiB beyond it
        assert cap is not None and cap.limit_bytes == 64 * 2**20
        assert cap.baseline_bytes == pytest.approx(status_bytes("VmRSS"), rel=0.2)  # the resident set then
        assert cap.used(cap.baseline_bytes + 5) == 5 and cap.used(0) == 0
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    with memory_limit(None, torch.device("cpu")) as cap:
        assert cap is None and resource.getrlimit(resource.RLIMIT_DATA) == before


MIB = 2**20


def capped(baseline: int, peak: int) -> dict[str, int]:
    return {
        "memory_limit_bytes": 100 * MIB,
        "memory_baseline_bytes": baseline * MIB,
        "peak_memory_bytes": peak * MIB,
    }


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        # under a cap: the peak beyond the baseline against the cap, not against the device
        (capped(500, 589), None),
        (capped(500, 590), "peak memory beyond set-up (90.0 MiB) at or above 90% of runtime.memory_limit_mb"),
        # no cap: the device's memory, as before
        ({"peak_memory_bytes": 899 * MIB}, None),
        ({"peak_memory_bytes": 900 * MIB}, "peak memory at or above 90% of the device memory"),
    ],
)
def test_the_90_percent_guard_measures_against_the_cap_when_there_is_one(
    fields: dict[str, int], reason: str | None
) -> None:
    out = {"total_memory_bytes": 1000 * MIB, "memory_limit_bytes": None, "memory_baseline_bytes": None}
    out.update(fields)
    assert near_memory_limit(out, torch.device("cuda")) == reason
    # a CPU cap is the kernel's, exact for every allocation: only a failed one is out of memory
    cpu_reason = reason if out["memory_limit_bytes"] is None else None
    assert near_memory_limit(out, torch.device("cpu")) == cpu_reason


def test_a_non_positive_cap_is_refused() -> None:
    refusal = r"runtime.memory_limit_mb: must be in \(0, 16,777,216\] or null, got 0"
    with pytest.raises(ConfigError, match=refusal):
        load_recipe(["tiny"], ["runtime.memory_limit_mb=0"])


@pytest.mark.slow  # a 1 GiB parent and one child process, ~3 s
def test_a_worker_started_by_a_large_parent_reports_its_own_peak() -> None:
    """ru_maxrss keeps the peak of the program a process replaced at exec: a benchmark worker started from a
    large test runner or controller took that peak for its own and every capped point failed the 90% guard."""
    held = torch.ones(2**28)  # 1 GiB, resident once written
    held += 1
    code = "import torch; from tiny_llm.runtime.device import peak_memory_bytes; "
    code += "print(peak_memory_bytes(torch.device('cpu')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # torch imported: a few hundred MiB, not the parent's 1 GiB
    assert int(proc.stdout) < 0.9 * held.numel() * held.element_size()
    del held
