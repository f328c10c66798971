"""runtime.memory_limit_mb: a memory cap under which running out looks like a CUDA out-of-memory.

One meaning on every device: the cap is what the measurement may allocate beyond what the process holds when
it is set, which the benchmark worker does once the engine is built (the model's weights and persistent
gradients and the synthetic batches are the baseline; optimizer state, activations and everything the
updates allocate count). The baseline (interpreter, torch, thread arenas, CUDA context, the built model)
differs between machines and runtimes; the shape's own working memory does not.

On the CPU the cap is the kernel's RLIMIT_DATA (private writable memory: the heap and every anonymous mmap, so
each tensor), set to what the process holds plus the cap. The allocator's failure there is a plain
RuntimeError (MemoryError from numpy or Python), re-raised as ``torch.OutOfMemoryError`` so the benchmark
worker records it as it records CUDA's. On a GPU it is a per-process fraction of device memory, set to what
the caching allocator has reserved plus the cap, and the allocator raises its own out-of-memory past it.
Under a CPU cap, allocations of 256 KiB or more get fresh mappings for the rest of the process
(``fresh_mappings_for_tensors``), which costs some throughput: a capped CPU measurement finds the frontier,
its tokens/s are not the headline figures. ``MemoryCap`` says what the cap and its baseline were, so the
worker's 90% guard measures a peak against the cap as the cap counts it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import resource
from collections.abc import Iterator
from dataclasses import dataclass

import torch

# DefaultCPUAllocator's message when malloc/posix_memalign fails (torch raises RuntimeError, not OOM).
CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"


# glibc mallopt parameter, and the size from which every allocation gets a fresh mapping under a cap.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 * 1024


def fresh_mappings_for_tensors() -> None:
    """Make glibc map every allocation of MMAP_THRESHOLD_BYTES or more afresh (and give its free heap back):
    memory this process freed earlier stays mapped, so reusing it would not grow VmData, and a cap measured
    from VmData would admit more than it says. A fixed threshold also stops glibc raising it as it frees."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    libc = ctypes.CDLL(name)
    if hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def status_bytes(field: str) -> int:
    """A size from /proc/self/status: VmData (what RLIMIT_DATA measures), VmRSS (resident)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field} line")


def data_segment_bytes() -> int:
    """The process's VmData: what RLIMIT_DATA measures."""
    return status_bytes("VmData")


@dataclass(frozen=True)
class MemoryCap:
    """A cap in force: ``limit_bytes`` beyond what the process held when it was set. ``baseline_bytes`` is
    that holding in the worker's peak measure (CUDA: allocated bytes; CPU: resident set), so
    ``peak - baseline_bytes`` is what the measurement itself used, as the cap counts it."""

    limit_bytes: int
    baseline_bytes: int

    def used(self, peak_bytes: int) -> int:
        return max(0, peak_bytes - self.baseline_bytes)


@contextlib.contextmanager
def memory_limit(limit_mb: int | None, device: torch.device) -> Iterator[MemoryCap | None]:
    """Cap what the body may allocate at ``limit_mb`` MiB beyond what the process holds now (None: no cap);
    lifted on exit, so the caller can still write its result after running out."""
    if limit_mb is None:
        yield None
        return
    limit = limit_mb * 2**20
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.empty_cache()  # cached free blocks would otherwise be reusable beyond the cap
        reserved = torch.cuda.memory_reserved(device)
        torch.cuda.set_per_process_memory_fraction(min(1.0, (reserved + limit) / total), device)
        try:
            yield MemoryCap(limit, int(torch.cuda.memory_allocated(device)))
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        return
    old = resource.getrlimit(resource.RLIMIT_DATA)
    fresh_mappings_for_tensors()
    cap = data_segment_bytes() + limit
    if old[1] != resource.RLIM_INFINITY:
        cap = min(cap, old[1])
    resource.setrlimit(resource.RLIMIT_DATA, (cap, old[1]))
    try:
        with cpu_out_of_memory():
            yield MemoryCap(limit, status_bytes("VmRSS"))
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, old)


@contextlib.contextmanager
def cpu_out_of_memory() -> Iterator[None]:
    """Re-raise a CPU allocation failure as ``torch.OutOfMemoryError`` (what CUDA raises)."""
    try:
        yield
    except MemoryError as exc:
        raise torch.OutOfMemoryError(f"CPU memory limit reached: {str(exc) or 'MemoryError'}") from exc
    except RuntimeError as exc:
        if CPU_ALLOCATOR_FAILURE not in str(exc) or isinstance(exc, torch.OutOfMemoryError):
            raise
        detail = str(exc).split(CPU_ALLOCATOR_FAILURE, 1)[1].strip(" :").splitlines()[0]
        raise torch.OutOfMemoryError(f"CPU memory limit reached: {detail}") from exc
